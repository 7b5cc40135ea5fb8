// Optimizer-in-backward: the same weights as the plain run (no clipping),
// with and without checkpointing, while full gradients never coexist.
#include <gtest/gtest.h>

#include "test_support.hpp"

namespace tightfit {
namespace {

class FusedUpdateTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& strategies) const {
    std::string r = test::tiny_recipe(corpus, dir.str(), "", strategies);
    r.replace(r.find("n_layer = 2"), 11, "n_layer = 4");
    r.replace(r.find("n_embd = 32"), 11, "n_embd = 64");
    r.replace(r.find("lr = 1e-3"), 9, "lr = 1e-3\ngrad_clip = 0.0");
    return r;
  }
  static std::map<std::string, at::Tensor> train_steps(Session& s, int steps) {
    for (int i = 0; i < steps; ++i) {
      s.update().zero_grad();
      auto b = s.data().batcher().next();
      s.executor().run_pass(b.tokens, b.targets, true, 1.0);
      EXPECT_EQ(s.update().optimizer_step(), TF_OK);
    }
    std::map<std::string, at::Tensor> out;
    for (const Param& p : s.store().all()) out[p.name] = p.value.detach().clone();
    return out;
  }
};

TEST_F(FusedUpdateTest, SameWeightsAsPlainRunAlsoWithCheckpointing) {
  const std::string fused = "[[strategy]]\nplugin = \"fused_update\"\nclip = \"none\"\n";
  const std::string ckpt = "[[strategy]]\nplugin = \"checkpoint\"\n";
  auto plain = test::make_session(recipe(""));
  const auto expected = train_steps(*plain, 5);
  for (const std::string& stack : {fused, ckpt + fused, fused + ckpt}) {
    auto s = test::make_session(recipe(stack));
    const auto got = train_steps(*s, 5);
    for (const auto& [name, w] : expected) {
      const double rel =
          (got.at(name) - w).abs().max().item<double>() / (w.abs().max().item<double>() + 1e-12);
      EXPECT_LE(rel, 1e-6) << name << " with\n" << stack;
    }
  }
}

TEST_F(FusedUpdateTest, GradientsAreFreedStageByStage) {
  // Completed gradients (category grads) of the plain run all coexist after
  // backward; with fused_update at most one block's plus the shared embedding's.
  if (const std::string why = test::categories_not_counted_here(); !why.empty()) GTEST_SKIP() << why;
  auto grads_peak = [&](const std::string& stack, int64_t* left_after) {
    auto s = test::make_session(recipe(stack));
    train_steps(*s, 1);
    s->update().zero_grad();
    auto& acct = MemoryAccounting::instance();
    acct.reset_peaks();
    const int64_t base = acct.snapshot().current[TF_MEM_GRADS];
    auto b = s->data().batcher().next();
    s->executor().run_pass(b.tokens, b.targets, true, 1.0);
    *left_after = 0;
    for (const Param& p : s->store().all())
      if (p.value.grad().defined()) *left_after += p.value.grad().numel() * 4;
    return acct.snapshot().peak[TF_MEM_GRADS] - base;
  };
  int64_t plain_left = 0, fused_left = 0;
  const int64_t plain = grads_peak("", &plain_left);
  const int64_t fused = grads_peak("[[strategy]]\nplugin = \"fused_update\"\n", &fused_left);
  const int64_t C = 64, block = 4 * (12 * C * C + 13 * C), wte = 4 * 256 * C;
  auto probe = test::make_session(recipe(""));
  EXPECT_EQ(plain_left, 4 * probe->store().count_params(true));
  EXPECT_EQ(fused_left, 0);
  EXPECT_EQ(plain, plain_left);
  EXPECT_LE(fused, block + wte) << "plain " << plain;
}

TEST_F(FusedUpdateTest, ClipsByThePreviousStepsNorm) {
  // SGD, whose steps scale with the gradient (AdamW's barely do); train()
  // runs the step loop, whose step_end records each step's norm.
  auto run = [&](const std::string& fused_keys) {
    std::string r = recipe("[[strategy]]\nplugin = \"fused_update\"\n" + fused_keys);
    r.replace(r.find("lr = 1e-3"), 9, "name = \"sgd\"\nlr = 0.1\nweight_decay = 0.0");
    r.replace(r.find("steps = 4"), 9, "steps = 3");
    r.replace(r.find("warmup_steps = 2"), 16, "warmup_steps = 0");
    auto s = test::make_session(r);
    const TrainSummary sum = s->train();
    EXPECT_GT(s->step_metrics().at("fused_update.grad_norm"), 0.01);
    return sum.losses;
  };
  const std::vector<double> unclipped = run("clip = \"none\"\n");
  const std::vector<double> clipped = run("max_norm = 0.01\n");
  // Step 1 is not clipped (there is no previous norm), so step 2 sees the
  // same weights; steps 2 and 3 are scaled far down, so step 3's loss lags.
  EXPECT_EQ(clipped[1], unclipped[1]);
  EXPECT_GT(clipped[2], unclipped[2] + 0.1) << clipped[2] << " vs " << unclipped[2];
}

}  // namespace
}  // namespace tightfit
