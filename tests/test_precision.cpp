// Mixed precision: bf16 autocast keeps fp32 weights and close losses with
// smaller activations; bf16 weights halve weight bytes and still train.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

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
  // The activations autograd keeps at the end of forward (the peak within
  // forward is a block's passing intermediates, the same in both).
  static int64_t kept_activations(Session& s) {
    auto b = s.data().batcher().next();
    const int64_t base = MemoryAccounting::instance().snapshot().current[TF_MEM_ACTIVATIONS];
    at::AutoGradMode grad(true);
    const at::Tensor loss = s.executor().forward_loss(b.tokens, b.targets, /*training=*/true);
    return MemoryAccounting::instance().snapshot().current[TF_MEM_ACTIVATIONS] - base;
  }
  static Pass pass(Session& s) {
    auto b = s.data().batcher().next();
    auto& acct = MemoryAccounting::instance();
    acct.reset_peaks();
    const int64_t base = acct.snapshot().current[TF_MEM_ACTIVATIONS];
    const double loss = s.executor().run_pass(b.tokens, b.targets, true, 1.0).loss;
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
  // (Activations by category: counted on the CPU only, test_support.hpp.)
  if (test::categories_not_counted_here().empty()) {
    const int64_t plain_kept = kept_activations(*plain), mixed_kept = kept_activations(*mixed);
    EXPECT_LT(mixed_kept, 0.85 * static_cast<double>(plain_kept))
        << plain_kept << " vs " << mixed_kept;
  }
  EXPECT_EQ(mixed->store().get("transformer.h.0.mlp.c_fc.weight").value.grad().scalar_type(),
            at::kFloat);
}

TEST_F(PrecisionTest, AutocastComposesWithCheckpointingExactly) {
  auto a = test::make_session(recipe("[[strategy]]\nplugin = \"precision\"\n"));
  auto b = test::make_session(
      recipe("[[strategy]]\nplugin = \"precision\"\n[[strategy]]\nplugin = \"checkpoint\"\n"));
  EXPECT_EQ(pass(*a).loss, pass(*b).loss);
  for (const Param& p : a->store().all()) {
    const at::Tensor& g = p.value.grad();
    const at::Tensor& h = b->store().get(p.name).value.grad();
    EXPECT_LE((g - h).abs().max().item<double>() / (g.abs().max().item<double>() + 1e-12), 1e-6)
        << p.name;
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
  auto b = s->data().batcher().next();
  s->update().optimizer().set_lr(3e-3);
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    s->update().zero_grad();
    last = s->executor().run_pass(b.tokens, b.targets, true, 1.0).loss;
    if (i == 0) first = last;
    ASSERT_EQ(s->update().optimizer_step(), TF_OK);
  }
  EXPECT_LT(last, first - 0.5);
  EXPECT_EQ(s->update().optimizer().state().at("transformer.wte.weight.exp_avg").scalar_type(),
            at::kFloat);
}

// fp16 autocast with dynamic loss scaling: the scaled backward gives the same
// (unscaled) gradients up to fp16 rounding; an overflow skips the update and
// halves the scale; finite steps grow it; it refuses a gradient consumer.
TEST_F(PrecisionTest, Fp16LossScalingUnscalesSkipsOverflowsAndAdapts) {
  const std::string fp16 = "[[strategy]]\nplugin = \"precision\"\ndtype = \"fp16\"\n";
  // Gradients are unscaled before the update: a scale of 1 and 1024 give
  // gradients within fp16 rounding of each other.
  auto grads_with = [&](double init_scale) {
    auto s = test::make_session(recipe(fp16 + "init_scale = " + std::to_string(init_scale) + "\n"));
    pass(*s);
    s->update().optimizer().set_lr(0.0);  // optimizer_step unscales; lr 0 keeps the weights
    EXPECT_EQ(s->update().optimizer_step(), TF_OK);
    return s->store().get("transformer.h.0.mlp.c_fc.weight").value.grad().clone();
  };
  {
    auto plain = test::make_session(recipe(""));
    auto half = test::make_session(recipe(fp16));
    const double a = pass(*plain).loss, b = pass(*half).loss;
    EXPECT_NEAR(a, b, 0.02);
    EXPECT_NE(a, b);  // it really computed in fp16
  }
  const at::Tensor g1 = grads_with(1.0), g2 = grads_with(1024.0);
  const double rel = (g1 - g2).abs().max().item<double>() / g1.abs().max().item<double>();
  EXPECT_LT(rel, 0.05);
  EXPECT_GT(g1.abs().max().item<double>(), 0.0);

  // A scale of 2^30 overflows: the update is skipped and the scale halves
  // until the gradients are finite; later steps train.
  std::string r = recipe(fp16 + "init_scale = 1073741824.0\ngrowth_interval = 3\n");
  r.replace(r.find("steps = 4"), 9, "steps = 40");
  auto s = test::make_session(r);
  const at::Tensor before =
      s->store().get("transformer.h.0.mlp.c_fc.weight").value.detach().clone();
  const TrainSummary sum = s->train();
  EXPECT_GT(s->step_metrics().at("precision.overflows"), 5.0);
  EXPECT_LT(s->step_metrics().at("precision.loss_scale"), 1073741824.0);
  EXPECT_FALSE(at::equal(before, s->store().get("transformer.h.0.mlp.c_fc.weight").value.detach()));
  EXPECT_LT(sum.losses.back(), sum.losses.front() - 0.3);
  for (const Param& p : s->store().all())
    EXPECT_TRUE(at::isfinite(p.value).all().item<bool>()) << p.name;
}

TEST_F(PrecisionTest, Fp16LossScaleGrowsAfterFiniteSteps) {
  std::string r = recipe(
      "[[strategy]]\nplugin = \"precision\"\ndtype = \"fp16\"\ninit_scale = 8.0\n"
      "growth_interval = 2\n");
  auto s = test::make_session(r);
  s->train();  // 4 finite steps: 8 -> 16 -> 32
  EXPECT_EQ(s->step_metrics().at("precision.loss_scale"), 32.0);
  EXPECT_EQ(s->step_metrics().at("precision.overflows"), 0.0);
}

TEST_F(PrecisionTest, Fp16RefusesWhatCannotWork) {
  EXPECT_THROW(test::make_session(recipe(
                   "[[strategy]]\nplugin = \"precision\"\nmode = \"bf16\"\ndtype = \"fp16\"\n")),
               std::exception);
  auto s =
      test::make_session(recipe("[[strategy]]\nplugin = \"precision\"\ndtype = \"fp16\"\n"
                                "[[strategy]]\nplugin = \"fused_update\"\n"));
  auto b = s->data().batcher().next();
  try {
    s->executor().run_pass(b.tokens, b.targets, true, 1.0);
    ADD_FAILURE() << "fused_update consumed a loss-scaled gradient";
  } catch (const PluginCallError& e) {
    EXPECT_NE(std::string(e.what()).find("fp16 loss scaling does not combine"), std::string::npos)
        << e.what();
  }
}

// bf16 weights cannot be made of weights another strategy keeps on disk:
// a clear refusal naming the weight and the ways out, not a crash.
TEST_F(PrecisionTest, Bf16RefusesWeightsKeptOnATier) {
  try {
    test::make_session(recipe(
        "[[strategy]]\nplugin = \"precision\"\nmode = \"bf16\"\n[[strategy]]\n"
        "plugin = \"offload\"\nparams = \"disk\"\noptimizer = \"disk\"\ntrainable = true\n"));
    ADD_FAILURE() << "bf16 weights on the disk tier were accepted";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("is kept on the disk tier by another strategy"), std::string::npos) << m;
    EXPECT_NE(m.find("mode = \"autocast\""), std::string::npos) << m;
  }
}

// On a CPU, precision measures its 16-bit matmul speed against fp32 at
// set-up and says so; where 16-bit arithmetic is emulated (slower than
// fp32 by more than 1.5x) it warns that the strategy costs speed here. The
// info line and the warning agree on every CPU.
TEST_F(PrecisionTest, SaysHowFast16BitComputeIsOnThisCpu) {
  if (std::getenv("TIGHTFIT_TEST_DEVICE")) GTEST_SKIP() << "a CPU-only notice";
  std::vector<std::string> lines;
  SessionOptions o;
  o.on_log = [&](const std::string& line) { lines.push_back(line); };
  test::make_session(recipe("[[strategy]]\nplugin = \"precision\"\n"), o);
  double ratio = -1;  // the figure as logged (a busy machine can round it to 0.0)
  bool warned = false;
  for (const std::string& l : lines) {
    if (const size_t at = l.find("a bf16 matmul takes "); at != std::string::npos)
      ratio = std::stod(l.substr(at + 20));
    if (l.find("this CPU emulates bf16 arithmetic") != std::string::npos) {
      warned = true;
      EXPECT_NE(l.find("saves memory but trains slower"), std::string::npos) << l;
    }
  }
  ASSERT_GE(ratio, 0) << "no measured ratio among " << lines.size() << " log lines";
  EXPECT_EQ(warned, ratio > 1.5) << "ratio " << ratio;
  // A dry run (plan, fit) measures nothing.
  lines.clear();
  SessionOptions dry = o;
  dry.dry_run = true;
  test::make_session(recipe("[[strategy]]\nplugin = \"precision\"\n"), dry);
  for (const std::string& l : lines) EXPECT_EQ(l.find("matmul takes"), std::string::npos) << l;
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// Grouped key/value heads go to LibTorch's attention as they are where its
// kernel serves them (the CPU's; CUDA's in 16 bits: flash and cuDNN) and
// repeated elsewhere. Either way a grouped model is the model whose k and v
// rows are its groups' repeated: the same loss under bf16 autocast, and
// each grouped k/v weight's gradient the sum of its copies'. (On the GPU,
// scripts/gpu-check runs this with TIGHTFIT_TEST_DEVICE=cuda:0.)
TEST(GroupedHeads, UnderAutocastEqualTheirHeadsRepeated) {
  test::TempDir dir;
  const std::string corpus = test::write_corpus(dir);
  auto recipe = [&](int kv_heads) {
    std::string r = test::tiny_recipe(corpus, dir.str(), "",
                                      "[[strategy]]\nplugin = \"precision\"\nmode = \"autocast\"\n");
    const auto begin = r.find("[model]"), end = r.find("[data]");
    r.replace(begin, end - begin,
              "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 64\n"
              "n_head = 4\nn_kv_head = " +
                  std::to_string(kv_heads) + "\nintermediate_size = 128\nmax_positions = 64\n\n");
    return r;
  };
  auto grouped = test::make_session(recipe(2));
  auto repeated = test::make_session(recipe(4));
  const int64_t groups = 2, head_dim = 16;
  {
    at::NoGradGuard no_grad;
    for (Param& p : repeated->store().all()) {
      const at::Tensor from = grouped->store().get(p.name).value;
      const bool kv = p.name.find("k_proj") != std::string::npos ||
                      p.name.find("v_proj") != std::string::npos;
      p.value.copy_(kv ? from.view({-1, head_dim, from.size(-1)})
                             .repeat_interleave(groups, 0)
                             .view(p.value.sizes())
                       : from);
    }
  }
  auto batch = grouped->data().batcher().next();
  const double a = grouped->executor().run_pass(batch.tokens, batch.targets, true, 1.0).loss;
  const double b = repeated->executor().run_pass(batch.tokens, batch.targets, true, 1.0).loss;
  EXPECT_NEAR(a, b, 1e-3 * std::abs(a));
  for (Param& p : grouped->store().all()) {
    if (!p.value.grad().defined()) continue;
    const at::Tensor g = p.value.grad().to(at::kCPU, at::kFloat);
    at::Tensor r = repeated->store().get(p.name).value.grad().to(at::kCPU, at::kFloat);
    if (p.name.find("k_proj") != std::string::npos || p.name.find("v_proj") != std::string::npos)
      r = r.view({-1, groups, head_dim, r.size(-1)}).sum(1).view(g.sizes());
    const double scale = std::max(g.abs().max().item<double>(), 1e-12);
    EXPECT_LT((g - r).abs().max().item<double>() / scale, 2e-2) << p.name;
  }
}

}  // namespace
}  // namespace tightfit
