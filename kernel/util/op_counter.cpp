#include "op_counter.hpp"

#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace tightfit {
namespace {

std::mutex g_mutex;
OpCounter::Counts g_counts;  // guarded by g_mutex
std::atomic<bool> g_installed{false};
thread_local int t_depth = 0;              // aten ops running on this thread
thread_local std::vector<bool> t_is_aten;  // per running record: an aten op?

bool is_aten(const char* name) {
  return std::strncmp(name, "aten::", 6) == 0;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  // Only aten ops count, and only they nest: an op inside an autograd
  // node's evaluation is the outermost op all the same (as the peers'
  // profiler events are counted in bench/dispatch.py).
  const bool aten = is_aten(fn.name());
  t_is_aten.push_back(aten);
  if (!aten) return nullptr;
  const bool outermost = t_depth++ == 0;
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_counts.all;
  ++g_counts.by_name[fn.name()];
  if (outermost) {
    ++g_counts.outermost;
    ++g_counts.outermost_by_name[fn.name()];
  }
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (t_is_aten.empty()) return;  // began before the counter was installed
  const bool aten = t_is_aten.back();
  t_is_aten.pop_back();
  if (aten && t_depth > 0) --t_depth;
}

}  // namespace

OpCounter::OpCounter() {
  if (g_installed.exchange(true)) throw std::logic_error("OpCounter: one at a time per process");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_counts = {};
  }
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                      .needsInputs(false)
                                      .scopes({at::RecordScope::FUNCTION}));
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  g_installed = false;
}

OpCounter::Counts OpCounter::counts() const {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_counts;
}

OpCounter::Counts operator-(const OpCounter::Counts& b, const OpCounter::Counts& a) {
  OpCounter::Counts d;
  d.all = b.all - a.all;
  d.outermost = b.outermost - a.outermost;
  for (const auto& [name, n] : b.by_name)
    if (const int64_t k = n - a.of(name); k != 0) d.by_name[name] = k;
  for (const auto& [name, n] : b.outermost_by_name) {
    const auto it = a.outermost_by_name.find(name);
    if (const int64_t k = n - (it == a.outermost_by_name.end() ? 0 : it->second); k != 0)
      d.outermost_by_name[name] = k;
  }
  return d;
}

}  // namespace tightfit
