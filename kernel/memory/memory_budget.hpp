// A run's memory budget, decided in one place from [run] memory_budget,
// memory_budget_scope and the training device, then applied to whatever
// enforces it: the tracked tensor bytes (a CPU run), the process's resident
// memory (scope "process") or the CUDA caching allocator (a GPU run). What
// the data setup, the planner and the out-of-budget advice need to know of
// it is read from here, never worked out again from the recipe's keys.
#pragma once

#include <cstdint>
#include <string>

namespace tightfit {

struct MemoryBudget {
  enum class Scope {
    kNone,     // none decided (a default-constructed budget)
    kTracked,  // the tensor bytes tightfit tracks on the CPU
    kProcess,  // the process's resident memory (memory_budget_scope = "process")
    kDevice,   // the GPU's memory, through the caching allocator
  };
  int64_t bytes = 0;  // the recipe's memory_budget; 0: no limit (the scope still says what a
                      // budget would bound: plan and fit take one from --budget)
  Scope scope = Scope::kNone;
  bool enforce = false;  // not a dry run: a dry run allocates nothing, and its budget must
                         // not refuse what the process does next (fit measures after planning)

  // Whether the host memory the data holds counts against the budget (the
  // budget is host memory): out-of-budget advice leaves it out of the
  // budget it suggests for the model.
  bool counts_host_data() const { return scope == Scope::kTracked || scope == Scope::kProcess; }
  bool on_gpu() const {
    return scope == Scope::kDevice;
  }  // a GPU run's budget is always the device's
  bool enforced() const { return enforce && bytes > 0 && scope != Scope::kNone; }
};

// `scope_key`: [run] memory_budget_scope ("tracked" or "process"). Throws
// std::invalid_argument (the caller names the recipe) for "process" on a
// CUDA device, whose budget is the device's memory.
MemoryBudget decide_memory_budget(int64_t bytes, const std::string& scope_key, bool cuda_device,
                                  bool dry_run);

// Hands the budget to what enforces it (MemoryAccounting's tracked and
// process budgets, or the CUDA allocator of `cuda_index`) and keeps it as
// the run's budget (run_memory_budget).
void apply_memory_budget(const MemoryBudget& budget, int cuda_index);

// The budget applied last in this process (none before any).
MemoryBudget run_memory_budget();

}  // namespace tightfit
