// Numeric faults: a NaN loss (injected with [run] debug_nan_at_steps) never
// trains the weights. The step is logged with the offending parameters, and
// [run] on_non_finite decides: skip the update, roll back to the last
// checkpoint and go on past the bad batch, or stop.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>

#include "checkpoint_checks.hpp"
#include "file_util.hpp"
#include "memory_accounting.hpp"
#include "safetensors.hpp"
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

// A run whose every step is skipped as non-finite trained nothing: it ends
// with an error (exit 1 at the command line) and saves no checkpoint, hf
// folder or adapter that would claim otherwise; one good step saves.
TEST_F(NumericFaults, ARunWhoseEveryStepIsSkippedSavesNothingAndFails) {
  const std::string all = "debug_nan_at_steps = [0, 1, 2, 3, 4, 5, 6, 7]\n";
  const std::string keep = "[save]\nevery = 2\nfinal = true\nhf = true\n";
  auto s = test::make_session(recipe(dir.str() + "/all", all, keep));
  try {
    s->train();
    ADD_FAILURE() << "a run that trained nothing ended as if it had";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("every one of the 8 steps run was non-finite"),
              std::string::npos)
        << e.what();
  }
  const std::filesystem::path run = dir.path() / "all" / "t";
  EXPECT_FALSE(std::filesystem::exists(run / "checkpoints" / "step-00000002"));
  EXPECT_FALSE(std::filesystem::exists(run / "checkpoints" / "step-00000008"));
  EXPECT_FALSE(std::filesystem::exists(run / "hf"));
  // Seven skipped and one good step: trained, saved.
  auto t = test::make_session(
      recipe(dir.str() + "/seven", "debug_nan_at_steps = [0, 1, 2, 3, 4, 5, 6]\n", keep));
  EXPECT_NO_THROW(t->train());
  EXPECT_TRUE(
      std::filesystem::exists(dir.path() / "seven" / "t" / "checkpoints" / "step-00000008"));
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

namespace tightfit {
namespace {

namespace fs = std::filesystem;

// A checkpoint is never saved with a NaN or an infinity in the trained
// weights or the optimizer state; the one saved before stays the newest
// (keep_last = 1 rotates nothing away) and --resume continues from it.
TEST_F(NumericFaults, NonFiniteStateIsNeverSavedAndRotationKeepsTheGoodOne) {
  const std::string out = dir.str() + "/nan";
  const std::string r = recipe(out, "", "[save]\nkeep_last = 1\nevery = 2\n");
  auto s = test::make_session(r);
  s->train();
  const fs::path good = fs::path(s->env().checkpoint_dir()) / "step-00000008";
  ASSERT_TRUE(fs::exists(good));
  Param& p = *s->store().trainable().front();
  {
    at::NoGradGuard no_grad;
    p.value.view(-1)[0] = std::nan("");
  }
  try {
    s->save_checkpoint(9);
    FAIL() << "a NaN weight was saved";
  } catch (const NonFiniteError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("parameter \"" + p.name + "\""), std::string::npos) << m;
    EXPECT_NE(m.find(good.string() + " is intact"), std::string::npos) << m;
  }
  EXPECT_TRUE(fs::exists(good));
  EXPECT_FALSE(fs::exists(good.parent_path() / "step-00000009"));
  // An infinite optimizer state is refused the same way.
  {
    at::NoGradGuard no_grad;
    p.value.view(-1)[0] = 0.0f;
    auto& state = s->update().optimizer().state();
    ASSERT_FALSE(state.empty());
    state.begin()->second.view(-1)[0] = std::numeric_limits<float>::infinity();
  }
  try {
    s->save_checkpoint(9);
    FAIL() << "an infinite optimizer state was saved";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer state \""), std::string::npos) << e.what();
  }
  SessionOptions o;
  o.resume = true;
  s.reset();  // the counts below are the resumed session's alone
  auto resumed = test::make_session(r, o);
  EXPECT_EQ(resumed->step(), 8);
  // The loaded optimizer state is counted as optimizer state.
  int64_t state_bytes = 0;
  for (const auto& [k, t] : resumed->update().optimizer().state())
    state_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  ASSERT_GT(state_bytes, 0);
  EXPECT_GE(MemoryAccounting::instance().snapshot().current[TF_MEM_OPTIMIZER], state_bytes);
}

// On --resume the optimizer state is validated; a bad newest checkpoint
// falls back to the one before, saying which file and why.
TEST_F(NumericFaults, ResumeRefusesBadOptimizerStateAndFallsBack) {
  const std::string out = dir.str() + "/opt";
  const std::string r = recipe(out, "", "[save]\nkeep_last = 3\nevery = 2\n");
  {
    auto s = test::make_session(r);
    s->train();
  }
  SessionOptions o;
  o.resume = true;
  const fs::path newest = fs::path(test::make_session(r, o)->env().checkpoint_dir()) /
                          "step-00000008" / "optimizer.safetensors";
  ASSERT_TRUE(fs::exists(newest));
  for (const auto& [what, edit] :
       std::vector<std::pair<std::string,
                             std::function<void(std::map<std::string,
                                                         at::Tensor>&)>>>{{"negative second moment",
                                                                           [](auto& m) {
                                                                             for (auto& [k, t] : m)
                                                                               if (k.size() > 11 &&
                                                                                   k.compare(
                                                                                       k.size() -
                                                                                           11,
                                                                                       11,
                                                                                       ".exp_avg_"
                                                                                       "sq") == 0) {
                                                                                 t.view(-1)[0] =
                                                                                     -1.0f;
                                                                                 return;
                                                                               }
                                                                           }},
                                                                          {"names no parameter",
                                                                           [](auto& m) {
                                                                             m["no.such.weight.exp_"
                                                                               "avg"] =
                                                                                 at::zeros({2});
                                                                           }},
                                                                          {"has shape",
                                                                           [](auto& m) {
                                                                             m.begin()->second =
                                                                                 at::zeros({3});
                                                                           }},
                                                                          {"holds a NaN",
                                                                           [](auto& m) {
                                                                             m.begin()->second.view(
                                                                                 -1)[0] =
                                                                                 std::nan("");
                                                                           }},
                                                                          {"not float32",
                                                                           [](auto& m) {
                                                                             m.begin()->second =
                                                                                 m.begin()->second.to(
                                                                                     at::kDouble);
                                                                           }}}) {
    auto file = read_safetensors(newest.string());
    const std::string saved = read_file_text(newest.string());
    std::map<std::string, at::Tensor> state;
    for (auto& [k, t] : file.tensors) state[k] = t.clone();
    edit(state);
    write_safetensors(newest.string(), state);
    auto s = test::make_session(r, o);
    EXPECT_EQ(s->step(), 6) << what;  // the one before the damaged newest
    write_file_synced(newest.string(), saved);
  }
}

}  // namespace
}  // namespace tightfit
