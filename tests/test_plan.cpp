// The memory planner: the models' declared activation bytes against what
// autograd keeps, the budget and GPU-table answers of `tightfit plan`, and
// clear answers for what it cannot plan. The predicted peak of whole recipes
// against their runs is tests/test_planned_peak.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "plan_recipes.hpp"

namespace tightfit {
namespace {

using test::kGpt2;
using test::kLlama;
using test::kRwkv;
using test::plan_of;
using test::recipe;
using test::relative;

struct ActivationCase {
  const char* name;
  const char* model;
};

class DeclaredActivations : public ::testing::TestWithParam<ActivationCase> {};

// What a model declares per stage is what autograd keeps: the activations
// alive at the end of forward, summed over stages, at fp32 and bf16.
TEST_P(DeclaredActivations, MatchWhatAutogradKeeps) {
  for (const char* dtype : {"fp32", "bf16"}) {
    test::TempDir dir;
    const std::string text =
        recipe(dir.str(), std::string(GetParam().model) + "dtype = \"" + dtype + "\"\n", "", "");
    const MemoryPlan plan = plan_of(text);
    const TrainSummary sum = test::make_session(text)->train();
    const int64_t measured = sum.memory.peak[TF_MEM_ACTIVATIONS];
    const int64_t declared = plan.device_peak_by_category[TF_MEM_ACTIVATIONS];
    EXPECT_LE(std::abs(relative(declared, measured)), 0.03)
        << GetParam().name << " " << dtype << ": declared " << declared << ", measured "
        << measured;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DeclaredActivations,
                         ::testing::Values(ActivationCase{"gpt2", kGpt2},
                                           ActivationCase{"llama", kLlama},
                                           ActivationCase{"rwkv", kRwkv}),
                         [](const auto& info) { return std::string(info.param.name); });

const char* kStandard = "";

TEST(Plan, NamesAPluginWithNoEstimateInsteadOfGuessing) {
  test::TempDir dir;
  std::string text = recipe(dir.str(), kGpt2, "plugin = \"fixture_good\"\n", "");
  text.replace(text.find("[run]\n"), 6,
               std::string("[run]\nplugin_paths = [\"") + TIGHTFIT_FIXTURE_DIR + "\"]\n");
  const MemoryPlan plan = plan_of(text);
  ASSERT_EQ(plan.unestimated.size(), 1u);
  EXPECT_EQ(plan.unestimated[0], "schedule fixture_good");
  const std::string path = test::write_file(dir, "r.toml", text);
  std::string out;
  EXPECT_EQ(test::run_tightfit("plan " + path, &out), 0) << out;
  EXPECT_NE(out.find("fixture_good: has no estimate_memory hook; its effect is NOT in this plan"),
            std::string::npos)
      << out;
}

TEST(Plan, SaysWhetherABudgetFits) {
  test::TempDir dir;
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), kGpt2, kStandard, ""));
  std::string out;
  EXPECT_EQ(test::run_tightfit("plan " + path + " --budget 64GiB", &out), 0) << out;
  EXPECT_NE(out.find("fits,"), std::string::npos) << out;
  EXPECT_NE(out.find("safe budget   "), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("plan " + path + " --budget 1MiB", &out), 3) << out;
  EXPECT_NE(out.find("does NOT fit"), std::string::npos) << out;
  // Between the planned peak and the safe budget: not "fits", but tight.
  const MemoryPlan plan = plan_of(recipe(dir.str(), kGpt2, kStandard, ""));
  const int64_t between = (plan.tracked_peak + plan.safe_budget()) / 2;
  EXPECT_EQ(test::run_tightfit("plan " + path + " --budget " + std::to_string(between), &out), 0)
      << out;
  EXPECT_NE(out.find("tight: the plan fits"), std::string::npos) << out;
  EXPECT_EQ(out.find("fits,"), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("plan " + path + " --budget lots", &out), 2) << out;
  EXPECT_NE(out.find("--budget"), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("plan " + (dir.path() / "missing.toml").string(), &out), 2) << out;
}

// The fit table: its largest batch is the largest whose plan fits the card.
TEST(Plan, GpuTableGivesTheLargestBatchThatFits) {
  test::TempDir dir;
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), kGpt2, kStandard, ""));
  std::string out;
  ASSERT_EQ(test::run_tightfit("plan " + path + " --gpus 3070", &out), 0) << out;
  const size_t row = out.find("RTX 3070 8GB");
  ASSERT_NE(row, std::string::npos) << out;
  std::istringstream fields(out.substr(row + std::string("RTX 3070 8GB").size()));
  std::string usable, fits, headroom;
  int64_t batch = 0;
  fields >> usable >> fits >> headroom >> batch;
  EXPECT_EQ(fits, "yes") << out;
  ASSERT_GT(batch, 8) << out;
  const int64_t card = static_cast<int64_t>((8 * 0.95 - 0.5) * 1024 * 1024 * 1024);
  auto peak_at = [&](int64_t b) {
    std::string json;
    EXPECT_EQ(test::run_tightfit("plan " + path + " --json --set data.batch_size=" +
                                     std::to_string(b) + " 2>/dev/null",
                                 &json),
              0)
        << json;
    const size_t at = json.find("\"device_peak\": ");
    return std::stoll(json.substr(at + 15));
  };
  EXPECT_LE(peak_at(batch), card);
  EXPECT_GT(peak_at(batch + 1), card);
  EXPECT_EQ(test::run_tightfit("plan " + path + " --gpus 9090", &out), 2);
  EXPECT_NE(out.find("unknown GPU \"9090\"; known: 3060"), std::string::npos) << out;
}

// A GPU recipe planned where the card is not: cuBLAS's workspaces, which
// the caching allocator holds from the first matmul on, are in the plan at
// LibTorch's Hopper default, resident through the step. (On the card the
// probe measures them: scripts/gpu-check's test_planned_peak.)
TEST(Plan, AGpuPlanCountsCublasWorkspacesEvenWithoutTheCard) {
  if (at::hasCUDA()) GTEST_SKIP() << "the card is here: the plan measures, not assumes";
  test::TempDir dir;
  const std::string cpu = recipe(dir.str(), kGpt2, kStandard, "");
  const MemoryPlan on_cpu = plan_of(cpu);
  const MemoryPlan on_gpu = plan_of(recipe(dir.str(), kGpt2, kStandard, "", "cuda:0"));
  const int64_t assumed = int64_t{64} << 20;
  int named = 0;
  for (const PlanContribution& c : on_gpu.contributions)
    if (c.plugin.rfind("cuBLAS workspaces (assumed", 0) == 0) {
      ++named;
      EXPECT_EQ(c.delta[TF_TIER_DEVICE][TF_MEM_TRANSIENT], assumed);
    }
  EXPECT_EQ(named, 1);
  for (const PlanContribution& c : on_cpu.contributions)
    EXPECT_EQ(c.plugin.find("cuBLAS"), std::string::npos) << c.plugin;
  EXPECT_EQ(on_gpu.at_peak[TF_TIER_DEVICE][TF_MEM_TRANSIENT],
            on_cpu.at_peak[TF_TIER_DEVICE][TF_MEM_TRANSIENT] + assumed);
  EXPECT_EQ(on_gpu.device_peak, on_cpu.device_peak + assumed);
}

TEST(Plan, RunPrintsThePlanNextToTheMeasuredPeak) {
  test::TempDir dir;
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), kGpt2, kStandard, ""));
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + path + " -q", &out), 0) << out;
  const size_t at = out.find("planned peak  ");
  ASSERT_NE(at, std::string::npos) << out;
  // "+1.2% against the measured ..." within the ten percent.
  const size_t pct = out.find('%', at);
  ASSERT_NE(pct, std::string::npos);
  const size_t start = out.rfind(' ', pct) + 1;
  const double err = std::strtod(out.substr(start, pct - start).c_str(), nullptr);
  EXPECT_LE(std::abs(err), 10.0) << out.substr(at, 120);
}

}  // namespace
}  // namespace tightfit
