// GPT-2: shapes, the loss of a fresh model, and learning on a fixed batch.
#include <gtest/gtest.h>

#include <cmath>

#include "test_support.hpp"

namespace tightfit {
namespace {

class Gpt2Test : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::unique_ptr<Session> session = test::make_session(test::tiny_recipe(corpus, dir.str()));
};

TEST_F(Gpt2Test, DeclaresHuggingFaceParametersAndStages) {
  auto& stages = session->executor().stages();
  ASSERT_EQ(stages.size(), 4u);  // embed, 2 blocks, head
  EXPECT_EQ(stages.front().kind, TF_STAGE_EMBED);
  EXPECT_EQ(stages.back().kind, TF_STAGE_HEAD);
  const Param& qkv = session->store().get("transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{96, 32}));
  EXPECT_TRUE(qkv.flags & TF_PARAM_HF_TRANSPOSED);
  EXPECT_EQ(session->store().get("transformer.wte.weight").shape, (std::vector<int64_t>{256, 32}));
  EXPECT_EQ(session->store().find("lm_head.weight"), nullptr);  // tied to wte
  // 2 blocks of 12 C^2 + 13 C, plus wte, wpe, ln_f.
  const int64_t C = 32;
  EXPECT_EQ(session->store().count_params(false),
            2 * (12 * C * C + 13 * C) + 256 * C + 64 * C + 2 * C);
}

TEST_F(Gpt2Test, LogitsHaveBatchTimeVocabShape) {
  at::NoGradGuard no_grad;
  at::Tensor tokens = at::randint(0, 256, {3, 17}, at::kLong);
  at::Tensor logits = session->executor().forward_logits(tokens, false);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 17, 256}));
  EXPECT_TRUE(logits.isfinite().all().item<bool>());
}

TEST_F(Gpt2Test, CausalMaskHidesTheFuture) {
  at::NoGradGuard no_grad;
  at::Tensor a = at::randint(0, 256, {1, 16}, at::kLong);
  at::Tensor b = a.clone();
  b.index_put_({0, 12}, (a.index({0, 12}) + 1) % 256);
  at::Tensor la = session->executor().forward_logits(a, false),
             lb = session->executor().forward_logits(b, false);
  EXPECT_TRUE(at::equal(la.slice(1, 0, 12), lb.slice(1, 0, 12)));
  EXPECT_FALSE(at::allclose(la.slice(1, 12), lb.slice(1, 12)));
}

TEST_F(Gpt2Test, FreshModelLossIsNearLnVocab) {
  auto batch = session->data().batcher().next();
  const PassResult r = session->executor().run_pass(batch.tokens, batch.targets, false, 1.0);
  EXPECT_NEAR(r.loss, std::log(256.0), 0.1);
}

TEST_F(Gpt2Test, FewStepsOnAFixedBatchDriveLossDown) {
  auto batch = session->data().batcher().next();
  session->update().optimizer().set_lr(3e-3);
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    session->update().zero_grad();
    const PassResult r = session->executor().run_pass(batch.tokens, batch.targets, true, 1.0);
    ASSERT_EQ(session->update().optimizer_step(), TF_OK);
    if (i == 0) first = r.loss;
    last = r.loss;
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST_F(Gpt2Test, TrainRunLearnsBelowUnigramEntropyAndSamples) {
  Recipe r = Recipe::parse(test::tiny_recipe(corpus, dir.str()), "r.toml");
  r.apply_override("run.steps=150");
  r.apply_override("run.sample_tokens=20");
  r.apply_override("optimizer.lr=3e-3");
  Session s(r, test::registry());
  const TrainSummary sum = s.train();
  EXPECT_EQ(sum.steps_run, 150);
  EXPECT_LT(sum.final_loss, sum.unigram_entropy - 0.3) << "loss " << sum.final_loss;
  EXPECT_EQ(sum.sample.size(), 20u);
  EXPECT_GT(sum.memory.peak[TF_MEM_ACTIVATIONS], 0);
  EXPECT_GT(sum.memory.peak[TF_MEM_OPTIMIZER], 0);
}

}  // namespace
}  // namespace tightfit
