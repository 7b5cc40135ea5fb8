// Mixed precision: bf16 autocast keeps fp32 weights and close losses with
// smaller activations; bf16 weights halve weight bytes and still train.
#include <gtest/gtest.h>

#include "test_support.hpp"

namespace tightfit {
namespace {

class PrecisionTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& strategies) const {
    std::string r = test::tiny_recipe(corpus, dir.str(), "", strategies);
    r.replace(r.find("n_embd = 32"), 11, "n_embd = 64");
    r.replace(r.find("seq_len = 32"), 12, "seq_len = 64");
    return r;
  }
  struct Pass {
    double loss;
    int64_t peak_activations;
  };
  static Pass pass(Session& s) {
    auto b = s.batcher().next();
    auto& acct = MemoryAccounting::instance();
    acct.reset_peaks();
    const int64_t base = acct.snapshot().current[TF_MEM_ACTIVATIONS];
    const double loss = s.run_pass(b.tokens, b.targets, true, 1.0).loss;
    return {loss, acct.snapshot().peak[TF_MEM_ACTIVATIONS] - base};
  }
};

TEST_F(PrecisionTest, AutocastKeepsFp32WeightsCloseLossAndSmallerActivations) {
  auto plain = test::make_session(recipe(""));
  auto mixed = test::make_session(recipe("[[strategy]]\nplugin = \"precision\"\n"));
  EXPECT_EQ(mixed->store().get("transformer.h.0.mlp.c_fc.weight").value.scalar_type(), at::kFloat);
  const Pass a = pass(*plain), b = pass(*mixed);
  EXPECT_NEAR(a.loss, b.loss, 0.02);
  EXPECT_NE(a.loss, b.loss);  // it really computed in bf16
  EXPECT_LT(b.peak_activations, 0.85 * static_cast<double>(a.peak_activations))
      << a.peak_activations << " vs " << b.peak_activations;
  EXPECT_EQ(mixed->store().get("transformer.h.0.mlp.c_fc.weight").value.grad().scalar_type(), at::kFloat);
}

TEST_F(PrecisionTest, AutocastComposesWithCheckpointingExactly) {
  auto a = test::make_session(recipe("[[strategy]]\nplugin = \"precision\"\n"));
  auto b = test::make_session(recipe("[[strategy]]\nplugin = \"precision\"\n[[strategy]]\nplugin = \"checkpoint\"\n"));
  EXPECT_EQ(pass(*a).loss, pass(*b).loss);
  for (const Param& p : a->store().all()) {
    const at::Tensor& g = p.value.grad();
    const at::Tensor& h = b->store().get(p.name).value.grad();
    EXPECT_LE((g - h).abs().max().item<double>() / (g.abs().max().item<double>() + 1e-12), 1e-6) << p.name;
  }
}

TEST_F(PrecisionTest, Bf16WeightsHalveBytesAndTrain) {
  auto plain = test::make_session(recipe(""));
  const int64_t fp32_bytes = plain->store().stored_bytes();
  plain.reset();
  auto s = test::make_session(recipe("[[strategy]]\nplugin = \"precision\"\nmode = \"bf16\"\n"));
  EXPECT_EQ(s->store().stored_bytes() * 2, fp32_bytes);
  EXPECT_EQ(s->store().get("transformer.wte.weight").value.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(s->store().get("transformer.wte.weight").value.requires_grad());
  auto b = s->batcher().next();
  s->optimizer().set_lr(3e-3);
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    s->zero_grad();
    last = s->run_pass(b.tokens, b.targets, true, 1.0).loss;
    if (i == 0) first = last;
    ASSERT_EQ(s->optimizer_step(), TF_OK);
  }
  EXPECT_LT(last, first - 0.5);
  EXPECT_EQ(s->optimizer().state().at("transformer.wte.weight.exp_avg").scalar_type(), at::kFloat);
}

}  // namespace
}  // namespace tightfit
