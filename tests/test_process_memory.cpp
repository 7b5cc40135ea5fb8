// The process's resident memory beside the tracked tensor bytes: read from
// the system, recorded per step and in the summary, planned as the host's
// overhead, and — with memory_budget_scope = "process" — a budget that stops
// a run whose RSS passes it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "memory_plan.hpp"
#include "process_memory.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(ProcessMemory, ReadsWhatTheProcessHoldsAndSeesItGrow) {
  const std::optional<ProcessMemory> before = read_process_memory();
  ASSERT_TRUE(before.has_value());
  EXPECT_GT(before->rss, 10 * kMiB);  // LibTorch alone is more
  EXPECT_GE(before->peak_rss, before->rss);
  EXPECT_LE(before->rss_anon + before->rss_file, before->rss + 4 * kMiB);
  // 64 MiB touched page by page is resident, and the peak follows it.
  std::vector<char> block(static_cast<size_t>(64 * kMiB));
  for (size_t i = 0; i < block.size(); i += 4096) block[i] = static_cast<char>(i);
  const std::optional<ProcessMemory> after = read_process_memory();
  ASSERT_TRUE(after.has_value());
  EXPECT_GE(after->rss - before->rss, 48 * kMiB);
  EXPECT_GE(after->peak_rss, after->rss);
  EXPECT_GT(static_cast<int>(block[4096]), -129);  // keeps the block alive to here
}

TEST(ProcessMemory, DescribesTheGapByCategory) {
  ProcessMemory start{300 * kMiB, 300 * kMiB, 200 * kMiB, 100 * kMiB};
  ProcessMemory peak{500 * kMiB, 520 * kMiB, 380 * kMiB, 120 * kMiB};
  const std::string d = describe_process_memory(start, peak, 150 * kMiB, 20 * kMiB);
  EXPECT_NE(d.find("520.0MiB = libraries and runtime 300.0MiB"), std::string::npos) << d;
  EXPECT_NE(d.find("tracked tensors 150.0MiB"), std::string::npos) << d;
  EXPECT_NE(d.find("memory-mapped file pages 20.0MiB"), std::string::npos) << d;
  EXPECT_NE(d.find("heap the allocator kept and untracked buffers 50.0MiB"), std::string::npos)
      << d;
  // Tracked bytes never touched (at::empty) can make the sum pass the RSS.
  const std::string over = describe_process_memory(start, peak, 300 * kMiB, 0);
  EXPECT_NE(over.find("never made resident 80.0MiB"), std::string::npos) << over;
  EXPECT_EQ(describe_process_memory(ProcessMemory{}, peak, 1, 0), "");
}

class ProcessBudgetTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);

  // The tiny recipe with `run_keys` added to [run].
  std::string recipe(const std::string& run_keys, const std::string& name) {
    std::string r = test::tiny_recipe(corpus, dir.str() + "/" + name);
    r.replace(r.find("steps = 4"), 9, "steps = 4\n" + run_keys);
    return r;
  }
  void TearDown() override {
    MemoryAccounting::instance().set_budget(0);
    MemoryAccounting::instance().set_process_budget(0);
  }
};

TEST_F(ProcessBudgetTest, MetricsAndSummaryRecordRssBesideTheTrackedPeak) {
  auto s = test::make_session(recipe("", "rss"));
  const TrainSummary sum = s->train();
  EXPECT_GT(sum.process.peak_rss, sum.memory.total_peak);
  EXPECT_NE(sum.process_memory.find("libraries and runtime"), std::string::npos)
      << sum.process_memory;
  EXPECT_NE(sum.process_memory.find("tracked tensors"), std::string::npos) << sum.process_memory;
  std::ifstream in(sum.metrics_path);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    const nlohmann::json rec = nlohmann::json::parse(line);
    ASSERT_TRUE(rec.contains("rss")) << line;
    ASSERT_TRUE(rec.contains("peak_rss")) << line;
    EXPECT_GT(rec["rss"].get<int64_t>(), rec["peak_total"].get<int64_t>() / 2) << line;
    EXPECT_GE(rec["peak_rss"].get<int64_t>(), rec["rss"].get<int64_t>()) << line;
    ++steps;
  }
  EXPECT_EQ(steps, 4);
}

// A budget under what the process already holds but far over the tiny
// model's tensors: the tracked scope trains, the process scope stops, naming
// the RSS and the key.
TEST_F(ProcessBudgetTest, ProcessScopeStopsARunWhoseRssPassesTheBudget) {
  const std::optional<ProcessMemory> now = read_process_memory();
  ASSERT_TRUE(now.has_value());
  const int64_t budget = now->rss - 8 * kMiB;
  ASSERT_GT(budget, 100 * kMiB);
  const std::string key = "memory_budget = " + std::to_string(budget) + "\n";
  {
    auto s = test::make_session(recipe(key, "tracked"));
    const TrainSummary sum = s->train();
    EXPECT_EQ(sum.steps_run, 4);
    EXPECT_GT(sum.process.peak_rss, budget);  // what the process scope would have refused
  }
  try {
    auto s = test::make_session(recipe(key + "memory_budget_scope = \"process\"\n", "process"));
    s->train();
    FAIL() << "a run whose RSS passes a process-scope budget went through";
  } catch (const OutOfBudgetError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("resident"), std::string::npos) << msg;
    EXPECT_NE(msg.find("memory_budget_scope = \"process\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("Fix:"), std::string::npos) << msg;
  }
}

TEST_F(ProcessBudgetTest, ProcessScopeIsACpuRunsAndARecipeErrorOnAGpu) {
  if (std::getenv("TIGHTFIT_TEST_DEVICE")) GTEST_SKIP() << "the recipe names a device already";
  std::string r = recipe("memory_budget_scope = \"process\"\n", "gpu");
  r.replace(r.find("[run]"), 5, "[run]\ndevice = \"cuda:0\"");
  SessionOptions dry;
  dry.dry_run = true;
  try {
    test::make_session(r, dry);
    FAIL() << "process scope on a GPU recipe was accepted";
  } catch (const RecipeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("memory_budget_scope = \"process\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  }
  EXPECT_NE(test::recipe_error(recipe("memory_budget_scope = \"rss\"\n", "bad"))
                .find("memory_budget_scope"),
            std::string::npos);
}

TEST_F(ProcessBudgetTest, PlanCountsTheHostOverheadUnderAProcessBudget) {
  SessionOptions dry;
  dry.dry_run = true;
  auto tracked = test::make_session(recipe("", "plan_t"), dry);
  const MemoryPlan a = plan_memory(tracked->parts());
  EXPECT_GT(a.host_overhead, 10 * kMiB);
  EXPECT_EQ(a.budget_need(), a.tracked_peak);
  auto process = test::make_session(recipe("memory_budget_scope = \"process\"\n", "plan_p"), dry);
  const MemoryPlan b = plan_memory(process->parts());
  EXPECT_TRUE(b.process_scope);
  EXPECT_EQ(b.budget_need(), b.tracked_peak + b.host_overhead);
}

}  // namespace
}  // namespace tightfit
