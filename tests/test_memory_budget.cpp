// The counting allocator attributes bytes to categories and keeps freed large
// blocks for reuse, and a run past its memory_budget stops with a clear
// error, not a crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cpu_block_cache.hpp"
#include "cuda_memory.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

TEST(MemoryAccounting, CountsByCategoryAndTracksPeaks) {
  auto& acct = MemoryAccounting::instance();
  acct.set_budget(0);
  const MemorySnapshot before = acct.snapshot();
  {
    CategoryScope scope(TF_MEM_OPTIMIZER);
    at::Tensor t = at::empty({1024, 256}, at::kFloat);  // 1 MiB
    const MemorySnapshot during = acct.snapshot();
    EXPECT_EQ(during.current[TF_MEM_OPTIMIZER] - before.current[TF_MEM_OPTIMIZER], 1 << 20);
    acct.retag(t, TF_MEM_GRADS);
    const MemorySnapshot after_retag = acct.snapshot();
    EXPECT_EQ(after_retag.current[TF_MEM_OPTIMIZER], before.current[TF_MEM_OPTIMIZER]);
    EXPECT_EQ(after_retag.current[TF_MEM_GRADS] - before.current[TF_MEM_GRADS], 1 << 20);
  }
  const MemorySnapshot after = acct.snapshot();
  EXPECT_EQ(after.current[TF_MEM_GRADS], before.current[TF_MEM_GRADS]);
  EXPECT_GE(after.peak[TF_MEM_GRADS] - before.current[TF_MEM_GRADS], 1 << 20);
}

TEST(MemoryAccounting, BudgetRefusesAllocationWithOutOfMemoryError) {
  auto& acct = MemoryAccounting::instance();
  acct.set_budget(acct.snapshot().total_current + (1 << 20));
  EXPECT_THROW(at::empty({1 << 20}, at::kFloat), c10::OutOfMemoryError);
  EXPECT_NO_THROW(at::empty({1024}, at::kFloat));
  acct.set_budget(0);
}

// Freed blocks of 1 MiB and more come back for the next allocation of their
// size class (no fresh pages to fault in), the tracked bytes stay the ones
// asked for, and the cache holds no more than its limit.
// On a CUDA device the caching allocator enforces the budget (its memory
// fraction) and throws its own OutOfMemoryError: said as the budget's
// refusal, naming the key and the fix, as the CPU allocator's is (the
// message LibTorch 2.11 gave on an H100, 2026-11-26).
TEST(MemoryAccounting, ADeviceAllocatorsRefusalNamesTheBudgetAndTheFix) {
  const std::string cuda =
      "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 79.18 GiB "
      "of which 77.91 GiB is free. 1024.00 KiB allowed; Of the allocated memory 0 bytes is "
      "allocated by PyTorch";
  const std::string budget = describe_device_refusal(cuda, int64_t{1} << 20);
  EXPECT_EQ(budget.rfind("out of memory budget", 0), 0u) << budget;
  EXPECT_NE(budget.find("run.memory_budget = 1.0MiB"), std::string::npos) << budget;
  EXPECT_NE(budget.find("Tried to allocate 2.00 MiB."), std::string::npos) << budget;
  EXPECT_EQ(budget.find("77.91 GiB"), std::string::npos) << budget;  // LibTorch's detail is cut
  EXPECT_NE(budget.find("Fix: raise run.memory_budget"), std::string::npos) << budget;
  const std::string full = describe_device_refusal(cuda, 0);
  EXPECT_EQ(full.rfind("out of device memory", 0), 0u) << full;
  EXPECT_EQ(full.find("run.memory_budget ="), std::string::npos) << full;
  EXPECT_NE(full.find("Fix: lower data.batch_size"), std::string::npos) << full;
  // A budget refusal through budget_refusal: an OutOfMemoryError the CPU
  // allocator did not record is the device's.
  MemoryAccounting::instance().clear_refusal();
  MemoryAccounting::instance().set_device_budget(int64_t{1} << 20);
  const c10::OutOfMemoryError e(c10::SourceLocation{"f", "file", 1}, cuda);
  const std::optional<std::string> said = budget_refusal(e);
  MemoryAccounting::instance().set_device_budget(0);
  ASSERT_TRUE(said.has_value());
  EXPECT_EQ(said->rfind("out of memory budget: the device's allocator", 0), 0u) << *said;
}

TEST(CpuBlockCache, SizeClassesWasteAtMostAnEighth) {
  EXPECT_EQ(CpuBlockCache::capacity_for(1000), 1000);
  EXPECT_EQ(CpuBlockCache::capacity_for(1 << 20), 1 << 20);
  EXPECT_EQ(CpuBlockCache::capacity_for((1 << 20) + 1), (1 << 20) + (1 << 17));
  for (int64_t n : {int64_t{3} << 20, int64_t{180355072}, int64_t{5} << 30, int64_t{1234567}}) {
    const int64_t c = CpuBlockCache::capacity_for(n);
    EXPECT_GE(c, n);
    EXPECT_LE(c, n + n / 8) << n;
    EXPECT_EQ(CpuBlockCache::capacity_for(c), c) << "a capacity is its own class";
  }
}

// Blocks under 1 MiB come from the heap's own free lists: the cache neither
// counts them live nor keeps them (no lock round trip per small tensor).
TEST(CpuBlockCache, SmallBlocksNeverPassTheCache) {
  MemoryAccounting::instance();  // installs the counting allocator
  cpu_block_cache().set_limit(int64_t{64} << 20);
  cpu_block_cache().release_all();
  const int64_t live = cpu_block_cache().live_bytes(), cached = cpu_block_cache().cached_bytes();
  {
    std::vector<at::Tensor> small;
    for (int i = 0; i < 16; ++i) small.push_back(at::empty({(1 << 18) - 1}, at::kFloat));
    EXPECT_EQ(cpu_block_cache().live_bytes(), live);
  }
  EXPECT_EQ(cpu_block_cache().live_bytes(), live);
  EXPECT_EQ(cpu_block_cache().cached_bytes(), cached);
  { at::Tensor large = at::empty({1 << 18}, at::kFloat); }  // 1 MiB: cached
  EXPECT_EQ(cpu_block_cache().cached_bytes(), cached + (1 << 20));
  cpu_block_cache().release_all();
}

TEST(CpuBlockCache, AFreedLargeBlockServesTheNextOfItsClass) {
  auto& acct = MemoryAccounting::instance();
  acct.set_budget(0);
  cpu_block_cache().set_limit(int64_t{64} << 20);
  cpu_block_cache().release_all();
  const int64_t before = acct.snapshot().total_current;
  void* first = nullptr;
  {
    at::Tensor t = at::empty({3 << 18}, at::kFloat);  // 3 MiB
    first = t.data_ptr();
    EXPECT_EQ(acct.snapshot().total_current - before, 3 << 20);
  }
  EXPECT_EQ(acct.snapshot().total_current, before);
  EXPECT_EQ(cpu_block_cache().cached_bytes(), 3 << 20);
  {
    at::Tensor t = at::empty({(3 << 18) - 1024}, at::kFloat);  // 4 KiB less: the same class
    EXPECT_EQ(t.data_ptr(), first);
    EXPECT_EQ(acct.snapshot().total_current - before, (3 << 20) - 4096);
    EXPECT_EQ(cpu_block_cache().cached_bytes(), 0);
    at::Tensor other = at::empty({5 << 18}, at::kFloat);  // another class: fresh
    EXPECT_NE(other.data_ptr(), first);
  }
  cpu_block_cache().set_limit(0);  // off: nothing kept
  EXPECT_EQ(cpu_block_cache().cached_bytes(), 0);
  { at::Tensor t = at::empty({3 << 18}, at::kFloat); }
  EXPECT_EQ(cpu_block_cache().cached_bytes(), 0);
}

TEST(CpuBlockCache, HoldsAtMostItsLimitDroppingTheOldest) {
  MemoryAccounting::instance();  // installs the counting allocator
  cpu_block_cache().set_limit(int64_t{9} << 20);
  cpu_block_cache().release_all();
  void* newest = nullptr;
  {
    std::vector<at::Tensor> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(at::empty({1 << 20}, at::kFloat));  // 4 MiB
    newest = blocks.back().data_ptr();
    for (auto& b : blocks) b.reset();  // freed oldest first
  }
  EXPECT_EQ(cpu_block_cache().cached_bytes(), int64_t{8} << 20);
  at::Tensor again = at::empty({1 << 20}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), newest);  // the most recently freed is kept
  again.reset();
  // 10 MiB: past the limit alone, so not kept when freed (10 MiB cached
  // else); its fresh pages also pushed the cached 8 MiB out (12 MiB mark).
  { at::Tensor big = at::empty({10 << 18}, at::kFloat); }
  EXPECT_EQ(cpu_block_cache().cached_bytes(), 0);
  cpu_block_cache().set_limit(int64_t{512} << 20);
  cpu_block_cache().release_all();
}

// The mark: the live high-water mark and an eighth of it (here under 2 MiB).
TEST(CpuBlockCache, NeverHoldsTheProcessAboveItsMark) {
  MemoryAccounting::instance();  // installs the counting allocator
  cpu_block_cache().set_limit(int64_t{64} << 20);
  cpu_block_cache().release_all();  // the mark starts at the live bytes
  const int64_t live = cpu_block_cache().live_bytes();
  {
    std::vector<at::Tensor> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(at::empty({1 << 20}, at::kFloat));  // 4 MiB
    EXPECT_EQ(cpu_block_cache().live_bytes() - live, int64_t{12} << 20);
  }
  EXPECT_EQ(cpu_block_cache().live_bytes(), live);
  EXPECT_EQ(cpu_block_cache().cached_bytes(), int64_t{12} << 20);  // the mark: 12 MiB
  at::Tensor hit = at::empty({1 << 20}, at::kFloat);  // from the cache: 4 live + 8 cached
  EXPECT_EQ(cpu_block_cache().cached_bytes(), int64_t{8} << 20);
  // A size the cache does not hold (a longer batch): 6 MiB fresh would make
  // 18 MiB resident; the oldest cached block goes, 14 MiB, then the next, 10.
  at::Tensor fresh = at::empty({6 << 18}, at::kFloat);
  EXPECT_EQ(cpu_block_cache().cached_bytes(), 0);
  EXPECT_EQ(cpu_block_cache().live_bytes() - live, int64_t{10} << 20);
  hit.reset();
  fresh.reset();
  EXPECT_EQ(cpu_block_cache().cached_bytes(), int64_t{10} << 20);  // both kept: within the mark
  {
    at::Tensor small = at::empty({1 << 19}, at::kFloat);  // 2 MiB, a miss: 12 MiB, the mark
    EXPECT_EQ(cpu_block_cache().cached_bytes(), int64_t{10} << 20);
  }
  cpu_block_cache().set_limit(int64_t{512} << 20);
  cpu_block_cache().release_all();
}

// While the live bytes climb to a new high (a first step's forward saving its
// inputs, set-up making layer after layer), a small fresh block leaves a
// large cached one in place within the eighth: the next request of its
// class is served from it. Past the eighth, the oldest goes as before.
TEST(CpuBlockCache, AClimbingLiveHighKeepsTheCacheWithinAnEighth) {
  MemoryAccounting::instance();  // installs the counting allocator
  cpu_block_cache().set_limit(int64_t{512} << 20);
  cpu_block_cache().release_all();
  const int64_t live = cpu_block_cache().live_bytes();
  const int64_t mib = int64_t{1} << 20;
  at::Tensor a = at::empty({8 << 20}, at::kFloat), b = at::empty({8 << 20}, at::kFloat);
  void* a_data = a.data_ptr();
  const int64_t high = live + 64 * mib, mark = high + high / 8;
  a.reset();  // 32 MiB cached; live at its high less 32
  // 4 MiB fresh: 32 cached + 36 live is over the high (64) but within the mark.
  at::Tensor saved = at::empty({1 << 20}, at::kFloat);
  ASSERT_LE(live + 32 * mib + 36 * mib, mark);
  EXPECT_EQ(cpu_block_cache().cached_bytes(), 32 * mib);
  at::Tensor again = at::empty({8 << 20}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), a_data);  // no fresh pages for it
  // Past the mark: both 32 MiB blocks cached, 40 MiB fresh on 4 live.
  again.reset();
  b.reset();
  EXPECT_EQ(cpu_block_cache().cached_bytes(), 64 * mib);
  ASSERT_GT(live + 64 * mib + 44 * mib, mark);
  at::Tensor big = at::empty({10 << 20}, at::kFloat);
  const int64_t resident = cpu_block_cache().cached_bytes() + cpu_block_cache().live_bytes();
  EXPECT_LE(resident, std::max(mark, live + 44 * mib + (live + 44 * mib) / 8));
  EXPECT_LT(cpu_block_cache().cached_bytes(), 64 * mib);
  big.reset();
  saved.reset();
  cpu_block_cache().release_all();
}

class BudgetTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
};

TEST_F(BudgetTest, RunPastBudgetStopsWithClearError) {
  std::string r = test::tiny_recipe(corpus, dir.str());
  r.replace(r.find("steps = 4"), 9, "steps = 4\nmemory_budget = \"1MiB\"");
  try {
    auto s = test::make_session(r);
    s->train();
    FAIL() << "a run past its budget went through";
  } catch (const OutOfBudgetError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("run.memory_budget = 1.0MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Fix:"), std::string::npos) << msg;
  }
  MemoryAccounting::instance().set_budget(0);
}

TEST_F(BudgetTest, BudgetHitInsideTrainingStepIsReported) {
  // Enough for the model and data, not for a step's activations.
  std::string r = test::tiny_recipe(corpus, dir.str());
  auto probe = test::make_session(r);
  const int64_t resident = MemoryAccounting::instance().snapshot().total_current;
  probe.reset();
  r.replace(r.find("steps = 4"), 9,
            "steps = 4\nmemory_budget = " + std::to_string(resident + (256 << 10)));
  auto s = test::make_session(r);
  EXPECT_THROW(s->train(), OutOfBudgetError);
  MemoryAccounting::instance().set_budget(0);
}

TEST_F(BudgetTest, CommandLineExitsWithCodeThreeAndMessage) {
  const std::string recipe = test::write_file(dir, "r.toml", test::tiny_recipe(corpus, dir.str()));
  std::string out;
  const int code =
      test::run_tightfit("run " + recipe + " --quiet --set run.memory_budget=2MiB", &out);
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("out of memory budget"), std::string::npos) << out;
}

TEST_F(BudgetTest, CommandLineRunsAndSummarizes) {
  const std::string recipe = test::write_file(dir, "r.toml", test::tiny_recipe(corpus, dir.str()));
  std::string out;
  const int code = test::run_tightfit("run " + recipe + " --set run.sample_tokens=10", &out);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("== summary"), std::string::npos) << out;
  EXPECT_NE(out.find("peak memory"), std::string::npos) << out;
  EXPECT_NE(out.find("step 4/4"), std::string::npos) << out;
}

TEST_F(BudgetTest, CommandLineRecipeErrorExitsWithCodeTwo) {
  const std::string text = test::tiny_recipe(corpus, dir.str(), "bogus = 1\n");
  const std::string recipe = test::write_file(dir, "r.toml", text);
  // The line the key is on (the tiny recipe names a device line on CUDA).
  const auto line = 1 + std::count(text.begin(), text.begin() + text.find("bogus"), '\n');
  std::string out;
  EXPECT_EQ(test::run_tightfit("run " + recipe, &out), 2) << out;
  EXPECT_NE(out.find("r.toml:" + std::to_string(line) + ":1: unknown key \"bogus\""),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// [run] deterministic is strict on CUDA: LibTorch's own refusal of an
// operator without a deterministic kernel is recognised, named by its first
// line, and nothing else is taken for it.
TEST(DeterministicMode, AnOperatorWithoutADeterministicKernelIsNamed) {
  auto& ctx = at::globalContext();
  const bool was = ctx.deterministicAlgorithms();
  const bool was_warn_only = ctx.deterministicAlgorithmsWarnOnly();
  ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
  std::optional<std::string> named;
  try {
    ctx.alertNotDeterministic("some_cuda_op");
    ADD_FAILURE() << "LibTorch did not refuse";
  } catch (const c10::Error& e) {
    named = nondeterministic_op(e);
  }
  ctx.setDeterministicAlgorithms(was, was_warn_only);
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->rfind("some_cuda_op does not have a deterministic implementation", 0), 0u)
      << *named;
  EXPECT_EQ(named->find('\n'), std::string::npos) << *named;
  EXPECT_FALSE(nondeterministic_op(std::runtime_error("CUDA error: device-side assert")));
}

}  // namespace
}  // namespace tightfit
