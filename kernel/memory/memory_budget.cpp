#include "memory_budget.hpp"

#include <algorithm>
#include <mutex>
#include <stdexcept>

#include "cuda_memory.hpp"
#include "memory_accounting.hpp"

namespace tightfit {
namespace {

std::mutex& applied_mutex() {
  static std::mutex m;
  return m;
}
MemoryBudget& applied() {
  static MemoryBudget b;
  return b;
}

}  // namespace

MemoryBudget decide_memory_budget(int64_t bytes, const std::string& scope_key, bool cuda_device,
                                  bool dry_run) {
  if (cuda_device && scope_key == "process")
    throw std::invalid_argument(
        "[run] memory_budget_scope = \"process\" bounds a CPU run's resident memory, but this "
        "run's device is a GPU, whose budget is the device's memory: remove the key or set it to "
        "\"tracked\"");
  MemoryBudget b;
  b.bytes = std::max<int64_t>(bytes, 0);
  b.enforce = !dry_run;
  if (cuda_device)
    b.scope = MemoryBudget::Scope::kDevice;
  else
    b.scope =
        scope_key == "process" ? MemoryBudget::Scope::kProcess : MemoryBudget::Scope::kTracked;
  return b;
}

void apply_memory_budget(const MemoryBudget& budget, int cuda_index) {
  auto& acct = MemoryAccounting::instance();
  const bool host = budget.enforced() && budget.counts_host_data();
  acct.set_budget(host ? budget.bytes : 0);
  acct.set_process_budget(host && budget.scope == MemoryBudget::Scope::kProcess ? budget.bytes : 0);
  acct.set_device_budget(0);
  if (budget.on_gpu() && budget.enforce) {
    // The caching allocator's memory fraction (0 lifts an earlier cap);
    // named in a refusal only where it is below the card (the cap it sets).
    const int64_t cap = budget.enforced() ? budget.bytes : 0;
    cuda_set_budget(cuda_index, cap);
    CudaMemory card;
    const bool capped = cap > 0 && cuda_memory(cuda_index, &card) && cap < card.total;
    acct.set_device_budget(capped ? cap : 0);
  }
  std::lock_guard<std::mutex> lock(applied_mutex());
  applied() = budget;
}

MemoryBudget run_memory_budget() {
  std::lock_guard<std::mutex> lock(applied_mutex());
  return applied();
}

}  // namespace tightfit
