#include "op_timer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>

namespace tightfit {
namespace {

std::atomic<int64_t> g_op_nanoseconds{0};
std::mutex g_by_name_mutex;
std::map<std::string, int64_t> g_by_name;
std::atomic<bool> g_installed{false};
// Nesting on this thread: only the outermost op's time counts (an aten op
// calls others; an autograd node runs ops).
thread_local int t_depth = 0;
// Across threads, the time during which at least one outermost op runs:
// ops on LibTorch's intra-op workers (a parallel_for of tensor ops) overlap
// the caller's, and summing them would count one second twice and pass the
// step's wall time (seen under load). Each such busy interval is charged to
// the op that opened it. Guarded by g_by_name_mutex.
int g_running = 0;
std::chrono::steady_clock::time_point g_busy_since;
std::string g_busy_opener;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (t_depth++ == 0) {
    std::lock_guard<std::mutex> lock(g_by_name_mutex);
    if (g_running++ == 0) {
      g_busy_since = std::chrono::steady_clock::now();
      g_busy_opener = fn.name();
    }
  }
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (t_depth > 0 && --t_depth == 0) {
    std::lock_guard<std::mutex> lock(g_by_name_mutex);
    if (g_running > 0 && --g_running == 0) {
      const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - g_busy_since)
                             .count();
      g_op_nanoseconds += ns;
      g_by_name[g_busy_opener] += ns;
    }
  }
}

}  // namespace

OpTimer::OpTimer() {
  if (g_installed.exchange(true)) throw std::logic_error("OpTimer: one at a time per process");
  g_op_nanoseconds = 0;
  {
    std::lock_guard<std::mutex> lock(g_by_name_mutex);
    g_by_name.clear();
    g_running = 0;
  }
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(on_start, on_end)
          .needsInputs(false)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

OpTimer::~OpTimer() {
  at::removeCallback(handle_);
  g_installed = false;
}

double OpTimer::seconds() const {
  return static_cast<double>(g_op_nanoseconds.load()) * 1e-9;
}

std::vector<std::pair<std::string, double>> OpTimer::by_name() const {
  std::vector<std::pair<std::string, double>> out;
  {
    std::lock_guard<std::mutex> lock(g_by_name_mutex);
    for (const auto& [name, ns] : g_by_name) out.emplace_back(name, static_cast<double>(ns) * 1e-9);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace tightfit
