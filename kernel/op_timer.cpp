#include "op_timer.hpp"

#include <atomic>
#include <chrono>
#include <stdexcept>

namespace tightfit {
namespace {

std::atomic<int64_t> g_op_nanoseconds{0};
std::atomic<bool> g_installed{false};
// Nesting on this thread: only the outermost op's time counts (an aten op
// calls others; an autograd node runs ops).
thread_local int t_depth = 0;
thread_local std::chrono::steady_clock::time_point t_start;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
  if (t_depth++ == 0) t_start = std::chrono::steady_clock::now();
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (t_depth > 0 && --t_depth == 0)
    g_op_nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - t_start)
                            .count();
}

}  // namespace

OpTimer::OpTimer() {
  if (g_installed.exchange(true)) throw std::logic_error("OpTimer: one at a time per process");
  g_op_nanoseconds = 0;
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

}  // namespace tightfit
