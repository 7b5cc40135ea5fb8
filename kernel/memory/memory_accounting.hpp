// Memory accounting: every tensor byte counted by category, with peaks, and an
// enforced budget.
//
// On CPU a counting allocator is installed into LibTorch (c10::SetCPUAllocator)
// so that every CPU tensor allocation passes through it; on CUDA the caching
// allocator's own statistics are read instead. Allocations are attributed to
// the category on top of the calling thread's category stack (forward pushes
// ACTIVATIONS, the optimizer pushes OPTIMIZER, ...), and can be re-tagged
// later (a gradient is born as a backward temporary and becomes GRADS).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "byte_size.hpp"
#include "process_memory.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

using CategoryCounts = std::array<int64_t, TF_MEM_CATEGORY_COUNT>;

struct MemorySnapshot {
  CategoryCounts current{};
  CategoryCounts peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;
  // The categories at the moment the total peaked: what made the peak.
  CategoryCounts at_peak{};
  int64_t budget = 0;
  // On a CUDA run: the caching allocator's allocated bytes (0 on CPU).
  int64_t device_current = 0;
  int64_t device_peak = 0;
};

const char* category_name(tf_mem_category c);

// Thrown (as c10::OutOfMemoryError) when an allocation would pass the budget.
std::string describe_budget_refusal(size_t requested, const MemorySnapshot& s);
// A device allocator's out-of-memory (LibTorch's CUDA message), said as the
// budget refusing it when `budget` (the run's memory_budget, below the
// card's memory) is what it hit, else as the device being full; with the fix.
std::string describe_device_refusal(const std::string& allocator_message, int64_t budget);

// When `e` is the budget refusing an allocation, its message (without
// LibTorch's C++ backtrace); nullopt otherwise. Known by type
// (c10::OutOfMemoryError, OutOfBudgetError), or — after LibTorch rethrew it as
// a plain c10::Error, as autograd's engine does across backward — by the
// refusal the allocator recorded when it refused, which this claims.
std::optional<std::string> budget_refusal(const std::exception& e);

class MemoryAccounting {
 public:
  // The process-wide accounting; installs the counting CPU allocator on first use.
  static MemoryAccounting& instance();

  // 0 disables the budget.
  void set_budget(int64_t bytes) { budget_.store(bytes); }
  int64_t budget() const { return budget_.load(); }
  // A CUDA run's run.memory_budget, which the caching allocator enforces as
  // its memory fraction (cuda_set_budget): kept to name it when it refuses.
  void set_device_budget(int64_t bytes) { device_budget_.store(bytes); }
  int64_t device_budget() const { return device_budget_.load(); }
  // [run] memory_budget_scope = "process": the process's resident memory
  // (RSS) must stay under `bytes` too. The allocator checks it every 16 MiB
  // of allocations and before any larger one; 0 disables it.
  void set_process_budget(int64_t bytes) { process_budget_.store(bytes); }
  int64_t process_budget() const { return process_budget_.load(); }
  // The allocator's check: the message refusing `requested` bytes when the
  // process's RSS would pass the process budget; nullopt when it would not,
  // or when no check is due (every 16 MiB, and before any larger request).
  std::optional<std::string> process_refusal(int64_t requested);
  // The same check against a reading the caller made (the trainer's, after
  // each step).
  std::optional<std::string> process_refusal(const ProcessMemory& now, int64_t requested) const;

  MemorySnapshot snapshot() const;
  void reset_peaks();

  // The counted bytes of a tensor's storage move from its category to `to`.
  // Storages not allocated by the counting allocator are ignored.
  void retag(const at::Tensor& t, tf_mem_category to);

  // Called by the allocator.
  void on_alloc(tf_mem_category c, int64_t bytes);
  void on_free(tf_mem_category c, int64_t bytes);
  bool would_exceed(int64_t bytes) const;
  // The allocator's refusals, recorded as they are made: the last one not yet
  // claimed by budget_refusal (cleared at each step, so an old one a plugin
  // recovered from never names a later error).
  void record_refusal(const std::string& message);
  std::optional<std::string> take_refusal();
  void clear_refusal();

 private:
  MemoryAccounting();
  std::array<std::atomic<int64_t>, TF_MEM_CATEGORY_COUNT> current_{};
  std::array<std::atomic<int64_t>, TF_MEM_CATEGORY_COUNT> peak_{};
  std::atomic<int64_t> total_current_{0};
  std::atomic<int64_t> total_peak_{0};
  std::array<std::atomic<int64_t>, TF_MEM_CATEGORY_COUNT> at_peak_{};
  std::atomic<int64_t> budget_{0};
  std::atomic<int64_t> process_budget_{0};
  std::atomic<int64_t> device_budget_{0};
  std::atomic<int64_t> since_process_check_{0};
  std::mutex refusal_mutex_;
  std::optional<std::string> refusal_;
  void record_at_peak();
};

// The counted CPU bytes the calling thread has allocated since it started
// (never decreases): what an operation allocates is the difference across it.
int64_t thread_allocated_cpu_bytes();

// The calling thread's current category.
tf_mem_category current_category();

// Attributes this thread's allocations to `c` for the scope's lifetime.
class CategoryScope {
 public:
  explicit CategoryScope(tf_mem_category c);
  ~CategoryScope();
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;
};

// Manual push/pop for the C ABI's memory_push_category / memory_pop_category.
void push_category(tf_mem_category c);
bool pop_category();

// The run went past run.memory_budget.
struct OutOfBudgetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace tightfit
