// What CPUs this process may use and how busy other processes keep them:
// the facts the intra-op thread count is chosen from (adaptive_threads.hpp).
// Linux only: sched_getaffinity, the cgroup's CPU quota (v2 cpu.max, v1
// cpu.cfs_quota_us / cpu.cfs_period_us) and /proc/stat.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tightfit {

struct UsableCpus {
  std::vector<int> ids;          // the CPUs sched_getaffinity allows
  double quota = 0;              // the cgroup's CPU quota in CPUs; 0 when none
  int count = 1;                 // ids.size(), capped by the quota rounded up; at least 1
  std::string describe() const;  // "2 CPUs (affinity 2, no cgroup quota)"
};
UsableCpus usable_cpus();

// The CPU time other processes took on `cpus` between samples, in CPUs (1.0
// = one CPU kept busy the whole time): the busy time /proc/stat counts on
// those CPUs less this process's own (/proc/self/stat), over the wall time.
class CpuLoad {
 public:
  explicit CpuLoad(std::vector<int> cpus);
  // Since the previous call (the first time: since made); nullopt when /proc
  // cannot be read or no clock tick has passed.
  std::optional<double> others_busy();

 private:
  struct Sample {
    int64_t busy_ticks = 0;   // on `cpus_`, everyone's
    int64_t own_ticks = 0;    // this process's, all threads
    int64_t total_ticks = 0;  // on `cpus_`, busy and idle
  };
  std::optional<Sample> sample() const;

  std::vector<int> cpus_;
  std::optional<Sample> last_;
};

// Intra-op threads for `usable` CPUs while other processes keep
// `others_busy` of them busy: the CPUs left (one counts as taken from 0.75
// busy, so a CPU shared now and then still gets a thread), at least 1.
int threads_beside(int usable, double others_busy);

}  // namespace tightfit
