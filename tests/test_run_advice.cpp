// The run's memory budget decided in one place (kernel/memory/memory_budget)
// and the `tightfit fit` command a run that went past it suggests
// (hosts/tightfit/fit_hint): on a CPU the data comes out of the budget; on a
// GPU, whose budget is the device's, the suggestion appears too (it never
// printed there before).
#include <gtest/gtest.h>

#include <stdexcept>

#include "fit_hint.hpp"
#include "memory_accounting.hpp"
#include "memory_budget.hpp"

namespace tightfit {
namespace {

using Scope = MemoryBudget::Scope;

TEST(MemoryBudget, IsDecidedFromTheKeysAndTheDevice) {
  // No limit: nothing is enforced, and the scope still says what one would bound.
  const MemoryBudget unlimited = decide_memory_budget(0, "process", false, false);
  EXPECT_EQ(unlimited.scope, Scope::kProcess);
  EXPECT_FALSE(unlimited.enforced());
  const MemoryBudget cpu = decide_memory_budget(1 << 30, "tracked", false, false);
  EXPECT_EQ(cpu.scope, Scope::kTracked);
  EXPECT_TRUE(cpu.counts_host_data());
  EXPECT_TRUE(cpu.enforced());
  EXPECT_EQ(decide_memory_budget(1 << 30, "process", false, false).scope, Scope::kProcess);
  const MemoryBudget gpu = decide_memory_budget(1 << 30, "tracked", true, false);
  EXPECT_EQ(gpu.scope, Scope::kDevice);
  EXPECT_FALSE(gpu.counts_host_data());
  // A dry run keeps what the budget is (plan reads it) and enforces nothing.
  const MemoryBudget dry = decide_memory_budget(1 << 30, "process", false, true);
  EXPECT_EQ(dry.scope, Scope::kProcess);
  EXPECT_FALSE(dry.enforced());
  EXPECT_THROW(decide_memory_budget(1 << 30, "process", true, false), std::invalid_argument);
}

TEST(MemoryBudget, IsAppliedToWhatEnforcesIt) {
  auto& acct = MemoryAccounting::instance();
  apply_memory_budget(decide_memory_budget(int64_t{3} << 30, "process", false, false), 0);
  EXPECT_EQ(acct.budget(), int64_t{3} << 30);
  EXPECT_EQ(acct.process_budget(), int64_t{3} << 30);
  EXPECT_EQ(run_memory_budget().scope, Scope::kProcess);
  // A dry run lifts what an earlier run set: it must refuse nothing.
  apply_memory_budget(decide_memory_budget(int64_t{3} << 30, "tracked", false, true), 0);
  EXPECT_EQ(acct.budget(), 0);
  EXPECT_EQ(acct.process_budget(), 0);
  apply_memory_budget(MemoryBudget{}, 0);
}

TEST(FitHint, TakesTheDataOutOfAHostBudget) {
  const MemoryBudget cpu = decide_memory_budget(int64_t{1} << 30, "tracked", false, false);
  const auto hint = host::fit_hint("r.toml", cpu, int64_t{100} << 20);
  ASSERT_TRUE(hint);
  EXPECT_NE(hint->find("tightfit fit r.toml --budget " +
                       std::to_string((int64_t{1} << 30) - (int64_t{100} << 20))),
            std::string::npos)
      << *hint;
  EXPECT_NE(hint->find("100.0MiB the data holds"), std::string::npos) << *hint;
  // The data itself did not fit (nothing held yet), or no budget: no hint.
  EXPECT_FALSE(host::fit_hint("r.toml", cpu, 0));
  EXPECT_FALSE(host::fit_hint("r.toml", cpu, int64_t{2} << 30));
  EXPECT_FALSE(host::fit_hint("r.toml", MemoryBudget{}, 0));
  EXPECT_FALSE(host::fit_hint("r.toml", decide_memory_budget(0, "tracked", false, false), 1));
}

TEST(FitHint, AppearsOnAGpuWithTheDevicesBudget) {
  const MemoryBudget gpu = decide_memory_budget(int64_t{8} << 30, "tracked", true, false);
  const auto hint = host::fit_hint("r.toml", gpu, int64_t{100} << 20);
  ASSERT_TRUE(hint);
  EXPECT_NE(hint->find("--budget " + std::to_string(int64_t{8} << 30) + " "), std::string::npos)
      << *hint;
  EXPECT_NE(hint->find("the data stays on the host"), std::string::npos) << *hint;
}

}  // namespace
}  // namespace tightfit
