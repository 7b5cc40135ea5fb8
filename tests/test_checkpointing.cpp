// Activation checkpointing is exact (same gradients as the plain run) and
// lowers the peak of activation memory.
#include <gtest/gtest.h>

#include "test_support.hpp"

namespace tightfit {
namespace {

struct PassOutcome {
  std::map<std::string, at::Tensor> grads;
  int64_t peak_activations = 0;
  double loss = 0;
};

PassOutcome one_pass(const std::string& recipe) {
  auto s = test::make_session(recipe);
  auto batch = s->data().batcher().next();
  MemoryAccounting::instance().reset_peaks();
  const int64_t before = MemoryAccounting::instance().snapshot().current[TF_MEM_ACTIVATIONS];
  const PassResult r = s->executor().run_pass(batch.tokens, batch.targets, true, 1.0);
  PassOutcome out;
  out.loss = r.loss;
  out.peak_activations = MemoryAccounting::instance().snapshot().peak[TF_MEM_ACTIVATIONS] - before;
  for (const Param& p : s->store().all()) out.grads[p.name] = p.value.grad().clone();
  return out;
}

class CheckpointingTest : public ::testing::TestWithParam<double> {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& strategy) const {
    // Wide enough that a block's activations dominate its input.
    std::string model = "dropout = " + std::to_string(GetParam()) + "\n";
    std::string r = test::tiny_recipe(corpus, dir.str(), model, strategy);
    r.replace(r.find("n_layer = 2"), 11, "n_layer = 4");
    r.replace(r.find("seq_len = 32"), 12, "seq_len = 64");
    return r;
  }
};

TEST_P(CheckpointingTest, GradientsEqualPlainRunAndActivationPeakDrops) {
  const PassOutcome plain = one_pass(recipe(""));
  const PassOutcome ckpt = one_pass(recipe("[[strategy]]\nplugin = \"checkpoint\"\nevery = 1\n"));
  EXPECT_EQ(plain.loss, ckpt.loss);
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (const auto& [name, g] : plain.grads) {
    const at::Tensor& h = ckpt.grads.at(name);
    ASSERT_TRUE(g.defined() && h.defined()) << name;
    const double scale = g.abs().max().item<double>() + 1e-30;
    const double diff = (g - h).abs().max().item<double>();
    EXPECT_LE(diff / scale, 1e-6) << name;
  }
  if (const std::string why = test::categories_not_counted_here(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_GT(plain.peak_activations, 0);
  EXPECT_LT(ckpt.peak_activations, 0.6 * static_cast<double>(plain.peak_activations))
      << "plain " << plain.peak_activations << " checkpointed " << ckpt.peak_activations;
}

// With dropout the recompute must replay the forward's random masks.
INSTANTIATE_TEST_SUITE_P(WithAndWithoutDropout, CheckpointingTest, ::testing::Values(0.0, 0.1));

TEST(CheckpointStrategy, EveryNMarksEveryNthBlock) {
  test::TempDir dir;
  std::string r = test::tiny_recipe(test::write_corpus(dir), dir.str(), "",
                                    "[[strategy]]\nplugin = \"checkpoint\"\nevery = 2\n");
  r.replace(r.find("n_layer = 2"), 11, "n_layer = 5");
  auto s = test::make_session(r);
  std::vector<bool> marked;
  for (const auto& st : s->executor().stages()) marked.push_back(st.recompute);
  EXPECT_EQ(marked, (std::vector<bool>{false, true, false, true, false, true, false}));
}

}  // namespace
}  // namespace tightfit
