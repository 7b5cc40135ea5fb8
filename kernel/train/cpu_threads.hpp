// The run's intra-op CPU threads. LibTorch splits each parallel operator's
// work evenly over its threads and waits for the last one, so a thread that
// shares its CPU with another process holds up all the others: on 2 cores
// beside one busy process, the main job's 2-thread step took 2.76x its time
// alone, one thread 1.74x (issue 62). So:
//   [run] threads = N     N threads, whatever the machine does;
//   [run] threads = 0     (default) one per CPU this process may use: the
//                         sched_getaffinity set, capped by the cgroup's CPU
//                         quota (LibTorch alone counts the machine's CPUs);
//   [run] adapt_threads   between steps, a thread fewer for each of those
//                         CPUs other processes keep busy, back when they
//                         are free. The count then follows the machine's
//                         load, and a parallel reduction's last bits follow
//                         the count: off, a run repeats bit for bit.
// The run says what it chose, and warns when others keep its CPUs busy.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "cpu_load.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

class CpuThreads {
 public:
  using Log = std::function<void(tf_log_level, const std::string&)>;
  // Sets LibTorch's thread count at once.
  CpuThreads(int64_t threads, bool adapt, Log log);

  // Between steps: with adapt, the load since the last look (at most once a
  // second) sets the count.
  void between_steps();
  int threads() const { return threads_; }
  // "2 threads on 2 CPUs (affinity 2, no cgroup quota)".
  std::string describe() const;

 private:
  void set(int threads);
  // Others' load since the last look: warns once when it takes CPUs.
  void look(double others_busy);

  UsableCpus cpus_;
  bool fixed_ = false;
  bool adapt_ = false;
  int threads_ = 1;
  Log log_;
  CpuLoad load_;
  std::chrono::steady_clock::time_point last_look_;
  bool warned_ = false;
};

// The threads an at::parallel_for in this library's code runs on: LibTorch's
// thread count, or 1 when the library was compiled without OpenMP (the
// wheel's at::parallel_for is a header template over OpenMP, which then
// runs every loop on the calling thread without a word).
int parallel_for_threads();

}  // namespace tightfit
