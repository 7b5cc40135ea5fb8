#include "cpu_threads.hpp"

#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <sstream>
#include <vector>

namespace tightfit {

CpuThreads::CpuThreads(int64_t threads, bool adapt, Log log)
    : cpus_(usable_cpus()),
      fixed_(threads > 0),
      adapt_(adapt && threads <= 0),
      log_(std::move(log)),
      load_(cpus_.ids),
      last_look_(std::chrono::steady_clock::now()) {
  set(fixed_ ? static_cast<int>(threads) : cpus_.count);
}

void CpuThreads::set(int threads) {
  threads_ = std::max(1, threads);
  if (at::get_num_threads() != threads_) at::set_num_threads(threads_);
}

std::string CpuThreads::describe() const {
  std::ostringstream os;
  os << threads_ << (threads_ == 1 ? " thread" : " threads") << " on " << cpus_.describe();
  if (fixed_) os << ", [run] threads";
  if (adapt_) os << ", following the machine's load ([run] adapt_threads)";
  return os.str();
}

void CpuThreads::look(double others_busy) {
  const int fit = threads_beside(cpus_.count, others_busy);
  if (fit < cpus_.count && !warned_) {
    warned_ = true;
    std::ostringstream os;
    os << "other processes keep about " << std::round(others_busy * 10) / 10 << " of this run's "
       << cpus_.count << " CPUs busy: ";
    if (adapt_)
      os << "training on " << fit << " of " << cpus_.count
         << " threads while they do ([run] adapt_threads)";
    else
      os << "its " << threads_
         << " threads wait on each other behind them, and steps may take several times "
            "longer; [run] adapt_threads = true uses a thread fewer for each CPU taken";
    log_(TF_LOG_WARN, os.str());
  }
  if (adapt_ && fit != threads_) {
    if (warned_ && fit > threads_)
      log_(TF_LOG_INFO, "CPUs free again: " + std::to_string(fit) + " threads");
    set(fit);
  }
}

void CpuThreads::between_steps() {
  if (!adapt_ && warned_) return;  // nothing more to say or do
  const auto now = std::chrono::steady_clock::now();
  if (now - last_look_ < std::chrono::seconds(1)) return;
  last_look_ = now;
  if (const std::optional<double> others = load_.others_busy()) look(*others);
}

int parallel_for_threads() {
  const int n = at::get_num_threads();
  std::vector<std::atomic<bool>> seen(static_cast<size_t>(n));
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    const int t = at::get_thread_num();
    if (t >= 0 && t < n) seen[static_cast<size_t>(t)] = true;
  });
  int count = 0;
  for (const auto& s : seen) count += s ? 1 : 0;
  return count;
}

}  // namespace tightfit
