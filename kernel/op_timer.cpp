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
thread_local std::chrono::steady_clock::time_point t_start;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
  if (t_depth++ == 0) t_start = std::chrono::steady_clock::now();
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_depth > 0 && --t_depth == 0) {
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - t_start)
                           .count();
    g_op_nanoseconds += ns;
    std::lock_guard<std::mutex> lock(g_by_name_mutex);
    g_by_name[fn.name()] += ns;
  }
}

}  // namespace

OpTimer::OpTimer() {
  if (g_installed.exchange(true)) throw std::logic_error("OpTimer: one at a time per process");
  g_op_nanoseconds = 0;
  {
    std::lock_guard<std::mutex> lock(g_by_name_mutex);
    g_by_name.clear();
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
