// Numeric faults: a NaN loss (injected with [run] debug_nan_at_steps) never
// trains the weights. The step is logged with the offending parameters, and
// [run] on_non_finite decides: skip the update, roll back to the last
// checkpoint and go on past the bad batch, or stop.
#include <gtest/gtest.h>

#include <cmath>

#include "test_support.hpp"

namespace tightfit {
namespace {

class NumericFaults : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& out, const std::string& run_extra,
                     const std::string& extra = "") const {
    std::string r = test::tiny_recipe(corpus, out, "", extra);
    r.replace(r.find("steps = 4"), 9, "steps = 8\n" + run_extra);
    return r;
  }
  // The trainable weights, flattened, after the run.
  static at::Tensor weights(Session& s) {
    std::vector<at::Tensor> parts;
    for (Param* p : s.store().trainable()) parts.push_back(p->value.detach().flatten().clone());
    return at::cat(parts);
  }
};

TEST_F(NumericFaults, SkipLeavesTheWeightsAsTheyWereAndGoesOn) {
  auto s = test::make_session(recipe(dir.str() + "/skip", "debug_nan_at_steps = [3]\n"));
  const TrainSummary sum = s->train();
  ASSERT_EQ(sum.losses.size(), 8u);
  EXPECT_TRUE(std::isnan(sum.losses[3]));
  for (size_t i = 4; i < 8; ++i) EXPECT_TRUE(std::isfinite(sum.losses[i])) << i;
  EXPECT_TRUE(weights(*s).isfinite().all().item<bool>());
  // The same run without the fault, stopped before it: step 3's update was
  // skipped, so step 4's loss is computed on the same weights as step 3's.
  SessionOptions o;
  o.stop_after_steps = 4;
  auto clean = test::make_session(recipe(dir.str() + "/clean", ""), o);
  const TrainSummary c = clean->train();
  EXPECT_EQ(sum.losses[2], c.losses[2]);
}

TEST_F(NumericFaults, StopEndsTheRunNamingTheStepAndParameters) {
  auto s = test::make_session(
      recipe(dir.str() + "/stop", "debug_nan_at_steps = [2]\non_non_finite = \"stop\"\n"));
  try {
    s->train();
    FAIL() << "the run went on after a NaN with on_non_finite = \"stop\"";
  } catch (const NonFiniteError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("step 2: non-finite gradient in"), std::string::npos) << msg;
    EXPECT_NE(msg.find("transformer.h.0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("on_non_finite"), std::string::npos) << msg;
  }
  EXPECT_TRUE(weights(*s).isfinite().all().item<bool>());
}

// Rollback restores the checkpoint of step 4 and continues with the batches
// after the bad one: the run still ends at its last step, all finite, and
// the steps from 4 on were trained again.
TEST_F(NumericFaults, RollbackRestoresTheLastCheckpointAndGoesOnPastTheBadBatch) {
  auto s = test::make_session(recipe(dir.str() + "/rb",
                                     "debug_nan_at_steps = [5]\non_non_finite = \"rollback\"\n",
                                     "[save]\nevery = 2\n"));
  const TrainSummary sum = s->train();
  EXPECT_EQ(s->step(), 8);
  // Steps 0-5 (5 non-finite), then 4-7 again after the rollback.
  ASSERT_EQ(sum.losses.size(), 10u);
  EXPECT_TRUE(std::isnan(sum.losses[5]));
  for (size_t i = 6; i < 10; ++i) EXPECT_TRUE(std::isfinite(sum.losses[i])) << i;
  // Step 4 again, from the same weights, on a later batch.
  EXPECT_NE(sum.losses[6], sum.losses[4]);
  EXPECT_TRUE(weights(*s).isfinite().all().item<bool>());
}

TEST_F(NumericFaults, RollbackWithoutACheckpointStopsClearly) {
  auto s = test::make_session(
      recipe(dir.str() + "/none", "debug_nan_at_steps = [1]\non_non_finite = \"rollback\"\n"));
  try {
    s->train();
    FAIL();
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("no checkpoint to roll back to"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tightfit
