// The head's projection fused with the loss ([run] fused_loss): the same loss
// and gradients as the whole logits' cross-entropy, for every built-in model,
// tied and untied, with ignored targets and under autocast; a fraction of the
// memory; a head a strategy extends falls back to the whole logits; the plan
// follows.
#include <gtest/gtest.h>

#include "cross_entropy.hpp"
#include "fused_head_loss.hpp"
#include "memory_accounting.hpp"
#include "memory_plan.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

struct Model {
  const char* name;
  const char* table;  // the [model] table
};

const Model kModels[] = {
    {"gpt2_tied",
     "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 2\n"
     "n_positions = 64\n"},
    {"llama_untied",
     "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\n"
     "n_head = 4\nn_kv_head = 2\nintermediate_size = 64\nmax_positions = 64\n"
     "tie_embeddings = false\nvocab_size = 700\n"},
    {"llama_tied",
     "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\n"
     "n_head = 4\nintermediate_size = 64\nmax_positions = 64\n"
     "tie_embeddings = true\n"},
    {"rwkv", "plugin = \"rwkv\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nwkv_chunk = 4\n"},
    // Gemma 2's capped logits (final_logit_softcapping 0.2): the cap and its slope per chunk.
    {"gemma2_capped",
     "plugin = \"llama\"\nconfig = \"" TIGHTFIT_SOURCE_DIR "/tests/fixtures/gemma2-tiny\"\n"},
};

std::string recipe(const test::TempDir& dir, const std::string& model, const std::string& run,
                   const std::string& extra = "") {
  std::string r = test::tiny_recipe(test::write_corpus(dir), dir.str(), "", extra);
  const auto begin = r.find("[model]"), end = r.find("[data]");
  r.replace(begin, end - begin, "[model]\n" + model + "\n");
  r.replace(r.find("[run]\n"), 6, "[run]\n" + run);
  return r;
}

struct Pass {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
  int64_t peak_above_start = 0;  // tracked bytes at the pass's peak, above its start
  int64_t grads_after = 0;       // gradient bytes the pass left
};

// One training pass with every fifth target ignored (kIgnoreIndex).
Pass one_pass(Session& s) {
  auto batch = s.data().batcher().next();
  at::Tensor targets = batch.targets.clone();
  targets.view(-1).slice(0, 0, targets.numel(), 5).fill_(kIgnoreIndex);
  auto& acct = MemoryAccounting::instance();
  const int64_t start = acct.snapshot().total_current;
  acct.reset_peaks();
  const PassResult r = s.executor().run_pass(batch.tokens, targets, /*backward=*/true, 1.0);
  Pass out;
  out.loss = r.loss;
  out.peak_above_start = acct.snapshot().total_peak - start;
  for (const Param& p : s.store().all()) {
    if (!p.value.grad().defined()) continue;
    out.grads[p.name] = p.value.grad().clone();
    out.grads_after += p.value.grad().nbytes();
  }
  return out;
}

class FusedLossModels : public ::testing::TestWithParam<Model> {};

// Uneven chunks (7 tokens of 128) against the whole logits: fp32 gradients
// within 1e-5 of their largest value, for a tied and an untied head.
TEST_P(FusedLossModels, GradientsEqualTheWholeLogitsLoss) {
  test::TempDir dir;
  auto fused = test::make_session(
      recipe(dir, GetParam().table, "fused_loss = true\nloss_chunk_tokens = 7\n"));
  auto whole = test::make_session(recipe(dir, GetParam().table, "fused_loss = false\n"));
  ASSERT_GE(fused->executor().fusable_head(), 0) << "the head declares its projection";
  EXPECT_EQ(whole->executor().fusable_head(), -1);
  const Pass a = one_pass(*whole), b = one_pass(*fused);
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(a.loss));
  test::expect_same_grads(a.grads, b.grads, 1e-5);
  // The evaluation loss (no gradients) takes the same path.
  auto batch = fused->data().batcher().validation(0);
  at::NoGradGuard no_grad;
  EXPECT_NEAR(fused->executor().forward_loss(batch.tokens, batch.targets, false).item<double>(),
              whole->executor().forward_loss(batch.tokens, batch.targets, false).item<double>(),
              1e-5);
}

INSTANTIATE_TEST_SUITE_P(Heads, FusedLossModels, ::testing::ValuesIn(kModels),
                         [](const auto& info) { return std::string(info.param.name); });

// bf16 autocast: the chunk's logits are computed in bf16 as linear would
// compute them, and the weight's gradient accumulates the chunks in fp32, so
// the fused gradients are those of the whole logits within bf16 rounding.
TEST(FusedLoss, UnderAutocastTheGradientsAreTheWholeLogitsOnesWithinBf16Rounding) {
  test::TempDir dir;
  const std::string precision = "[[strategy]]\nplugin = \"precision\"\n";
  auto fused = test::make_session(
      recipe(dir, kModels[1].table, "fused_loss = true\nloss_chunk_tokens = 16\n", precision));
  auto whole = test::make_session(recipe(dir, kModels[1].table, "fused_loss = false\n", precision));
  const Pass a = one_pass(*whole), b = one_pass(*fused);
  EXPECT_NEAR(a.loss, b.loss, 1e-3 * std::abs(a.loss));
  test::expect_same_grads(a.grads, b.grads, 2e-2);
}

// At 128 tokens and a 16,384-word vocabulary the whole logits are 8 MiB; in
// chunks of 16 tokens, 1 MiB at a time. What the pass holds above its start,
// less the gradients it leaves, shrinks by far more than half.
TEST(FusedLoss, HoldsAFractionOfTheWholeLogitsMemory) {
  test::TempDir dir;
  const std::string model =
      "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 1\nn_embd = 32\nn_head = 4\n"
      "intermediate_size = 64\nmax_positions = 64\ntie_embeddings = false\nvocab_size = 16384\n";
  auto fused =
      test::make_session(recipe(dir, model, "fused_loss = true\nloss_chunk_tokens = 16\n"));
  auto whole = test::make_session(recipe(dir, model, "fused_loss = false\n"));
  const Pass a = one_pass(*whole), b = one_pass(*fused);
  const int64_t whole_extra = a.peak_above_start - a.grads_after;
  const int64_t fused_extra = b.peak_above_start - b.grads_after;
  const int64_t logits = int64_t{4} * 128 * 16384;
  EXPECT_GE(whole_extra, logits) << "the whole logits are held";
  EXPECT_LE(fused_extra, whole_extra / 4) << "whole " << whole_extra << " fused " << fused_extra;
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(a.loss));
}

// A strategy that extends the head's projection (here a logit bias through
// linear_extend; LoRA on lm_head would too): the loss cannot fuse what it does
// not know, so it takes the logits whole, and the gradients reach the
// extension's parameter as without fusing.
TEST(FusedLoss, AHeadAStrategyExtendsTakesTheLogitsWhole) {
  test::TempDir dir;
  const std::string strategy =
      "[[strategy]]\nplugin = \"head_logit_bias\"\nweight = \"lm_head.weight\"\n";
  const std::string paths =
      "plugin_paths = [\"" + std::string(TIGHTFIT_FIXTURE_DIR) + "/head_logit_bias\"]\n";
  auto fused = test::make_session(recipe(
      dir, kModels[1].table, paths + "fused_loss = true\nloss_chunk_tokens = 7\n", strategy));
  auto whole =
      test::make_session(recipe(dir, kModels[1].table, paths + "fused_loss = false\n", strategy));
  EXPECT_GE(fused->executor().fusable_head(), 0) << "not known before the first pass";
  const Pass a = one_pass(*whole), b = one_pass(*fused);
  EXPECT_EQ(fused->executor().fusable_head(), -1) << "the first pass found the extension";
  ASSERT_TRUE(b.grads.count("head_logit_bias"));
  EXPECT_GT(b.grads.at("head_logit_bias").abs().max().item<double>(), 0);
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(a.loss));
  test::expect_same_grads(a.grads, b.grads, 1e-6);
}

// The fused loss on its own: a chunk size that does not divide the tokens,
// a bias, every target ignored but one, against at::cross_entropy in double
// (the loss computes in fp32, as the whole logits' does: within fp32
// rounding).
TEST(FusedLoss, MatchesLibTorchCrossEntropyWithABias) {
  at::manual_seed(3);
  const at::Tensor hidden = at::randn({5, 7, 16}, at::kDouble).requires_grad_(true);
  const at::Tensor w = (at::randn({50, 16}, at::kDouble) * 0.3).requires_grad_(true);
  const at::Tensor b = at::randn({50}, at::kDouble).requires_grad_(true);
  at::Tensor targets = at::randint(50, {5, 7}, at::kLong);
  for (const bool one_counted : {false, true}) {
    if (one_counted) {
      targets.fill_(kIgnoreIndex);
      targets[2][3] = 11;
    }
    const at::Tensor fused = fused_head_loss(hidden, targets, {w, b}, 4, 1.0);
    const auto fused_grads = torch::autograd::grad({fused}, {hidden, w, b});
    const at::Tensor logits = at::linear(hidden, w, b).reshape({-1, 50});
    const at::Tensor plain = at::cross_entropy_loss(logits, targets.reshape({-1}), {},
                                                    at::Reduction::Mean, kIgnoreIndex);
    const auto plain_grads = torch::autograd::grad({plain}, {hidden, w, b});
    EXPECT_NEAR(fused.item<double>(), plain.item<double>(), 1e-6 * plain.item<double>());
    for (size_t i = 0; i < 3; ++i) {
      const double scale = plain_grads[i].abs().max().item<double>();
      EXPECT_GT(scale, 0) << i;
      EXPECT_LE((fused_grads[i] - plain_grads[i]).abs().max().item<double>(), 1e-6 * scale) << i;
    }
  }
}

// A capped head (ABI 1.14 projection_softcap): c tanh(z / c) per chunk and
// its slope in the gradients, against the capped whole logits in double, with
// a cap the logits reach (|z| up to about 3c) so that the slope is far from 1.
TEST(FusedLoss, CapsEachChunkAsTheWholeCappedLogits) {
  at::manual_seed(5);
  const at::Tensor hidden = at::randn({3, 7, 16}, at::kDouble).requires_grad_(true);
  const at::Tensor w = (at::randn({40, 16}, at::kDouble) * 0.5).requires_grad_(true);
  const at::Tensor b = at::randn({40}, at::kDouble).requires_grad_(true);
  const at::Tensor targets = at::randint(40, {3, 7}, at::kLong);
  const double cap = 2.0;
  HeadProjection p{w, b, cap};
  const at::Tensor fused = fused_head_loss(hidden, targets, p, 4, 1.0);
  const auto fused_grads = torch::autograd::grad({fused}, {hidden, w, b});
  const at::Tensor z = at::linear(hidden, w, b).reshape({-1, 40});
  ASSERT_GT(z.abs().max().item<double>(), 2 * cap);
  const at::Tensor capped = at::tanh(z / cap) * cap;
  const at::Tensor plain = at::cross_entropy_loss(capped, targets.reshape({-1}));
  const auto plain_grads = torch::autograd::grad({plain}, {hidden, w, b});
  EXPECT_NEAR(fused.item<double>(), plain.item<double>(), 1e-6 * plain.item<double>());
  for (size_t i = 0; i < 3; ++i) {
    const double scale = plain_grads[i].abs().max().item<double>();
    EXPECT_LE((fused_grads[i] - plain_grads[i]).abs().max().item<double>(), 1e-6 * scale) << i;
  }
  // Each target's own loss (the weighted form token_logps uses) is capped too.
  const at::Tensor each = at::empty({21}, at::kFloat);
  {
    at::NoGradGuard no_grad;
    fused_head_weighted_loss(hidden, targets, p, 4, 1.0, at::Tensor(), each);
  }
  const at::Tensor expected =
      at::cross_entropy_loss(capped, targets.reshape({-1}), {}, at::Reduction::None);
  EXPECT_LE((each.to(at::kDouble) - expected).abs().max().item<double>(), 1e-5);
  // Each row's capped logits averaged over the vocabulary (TRL's
  // logits/chosen before its mean over tokens), chunk by chunk, with and
  // without a backward.
  const at::Tensor expected_means = capped.mean(1);
  for (const bool backward : {false, true}) {
    const at::Tensor means = at::empty({21}, at::kFloat), each_again = at::empty({21}, at::kFloat);
    at::AutoGradMode mode(backward);
    const at::Tensor loss = fused_head_weighted_loss(
        hidden, targets, p, 4, 1.0, at::full({21}, -1.0, at::kFloat), each_again, means);
    if (backward) torch::autograd::grad({loss}, {hidden, w, b});
    EXPECT_LE((means.to(at::kDouble) - expected_means).abs().max().item<double>(), 1e-5)
        << backward;
    EXPECT_GT((expected_means - z.mean(1)).abs().max().item<double>(), 1e-2);  // capped
  }
  // Without the cap the loss differs: the cap was applied.
  EXPECT_GT(std::abs(fused_head_loss(hidden, targets, {w, b}, 4, 1.0).item<double>() -
                     plain.item<double>()),
            1e-2);
}

// Targets on the host with most of them ignored (a GRPO row's prompt, an
// SFT row's masked prompt): only the counted rows are projected over the
// vocabulary — the pass's peak is a few rows' logits, not every row's — and
// the loss, each row's loss and entropy and the gradients are the whole
// logits' (0 on the ignored rows), with and without a backward.
TEST(FusedLoss, ProjectsOnlyTheRowsWhoseTargetCounts) {
  at::manual_seed(7);
  const int64_t B = 4, T = 50, C = 16, V = 3000;
  const at::Tensor hidden = at::randn({B, T, C}).requires_grad_(true);
  const at::Tensor w = (at::randn({V, C}) * 0.3).requires_grad_(true);
  at::Tensor targets = at::full({B, T}, kIgnoreIndex, at::kLong);
  targets.narrow(1, T - 5, 5).copy_(at::randint(V, {B, 5}, at::kLong));  // 20 of 200 count
  const at::Tensor counted = targets.reshape({-1}).ne(kIgnoreIndex);
  const at::Tensor grad_weights = at::where(counted, at::rand({B * T}) - 0.5, at::zeros({B * T}));
  // The whole logits in double.
  const at::Tensor hd = hidden.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor wd = w.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor lp = at::log_softmax(at::linear(hd, wd).reshape({-1, V}), 1);
  const at::Tensor ce =
      -lp.gather(1, targets.reshape({-1, 1}).clamp_min(0)).squeeze(1) * counted.to(at::kDouble);
  const at::Tensor entropy = -(lp.exp() * lp).sum(1) * counted.to(at::kDouble);
  const at::Tensor plain = (ce * grad_weights.to(at::kDouble)).sum();
  const auto plain_grads = torch::autograd::grad({plain}, {hd, wd});
  auto& acct = MemoryAccounting::instance();
  for (const bool backward : {false, true}) {
    const at::Tensor each = at::full({B * T}, 7.0, at::kFloat);  // ignored rows: written 0
    const at::Tensor entropies = at::full({B * T}, 7.0, at::kFloat);
    at::AutoGradMode mode(backward);
    const int64_t start = acct.snapshot().total_current;
    acct.reset_peaks();
    const at::Tensor loss =
        fused_head_weighted_loss(hidden, targets, {w}, 256, 1.0,
                                 backward ? grad_weights : at::Tensor(), each, {}, 1.0, entropies);
    const int64_t peak = acct.snapshot().total_peak - start;
    EXPECT_LT(peak, B * T * V * 4 / 2) << "every row's logits were made: " << peak << " bytes";
    EXPECT_GE(peak, 20 * V * 4) << "the counted rows' logits";
    EXPECT_LE((each.to(at::kDouble) - ce.detach()).abs().max().item<double>(), 1e-5);
    EXPECT_LE((entropies.to(at::kDouble) - entropy.detach()).abs().max().item<double>(), 1e-5);
    if (!backward) continue;
    EXPECT_NEAR(loss.item<double>(), plain.item<double>(), 1e-5);
    const auto grads = torch::autograd::grad({loss}, {hidden, w});
    for (size_t i = 0; i < 2; ++i) {
      const double scale = plain_grads[i].abs().max().item<double>();
      EXPECT_GT(scale, 0) << i;
      EXPECT_LE((grads[i].to(at::kDouble) - plain_grads[i]).abs().max().item<double>(),
                1e-5 * scale)
          << i;
    }
    // An ignored row's hidden state gets no gradient.
    EXPECT_EQ(grads[0].reshape({-1, C}).index({~counted}).abs().max().item<double>(), 0.0);
  }
  // The mean loss alike: that of the counted rows.
  const at::Tensor mean = fused_head_loss(hidden, targets, {w}, 256, 1.0);
  EXPECT_NEAR(mean.item<double>(), ce.sum().item<double>() / 20, 1e-5);
}

// The plan keeps a chunk of logits, not all of them: its activations shrink,
// and its peak stays within the measured one's reach (tests/test_planned_peak.cpp
// holds every recipe's plan to the measured peak; this checks the fused
// head's share moved).
TEST(FusedLoss, ThePlanKeepsAChunkOfLogitsNotAllOfThem) {
  test::TempDir dir;
  const std::string model =
      "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 1\nn_embd = 32\nn_head = 4\n"
      "intermediate_size = 64\nmax_positions = 64\ntie_embeddings = false\nvocab_size = 16384\n";
  const MemoryPlan fused = plan_memory(
      test::make_session(recipe(dir, model, "fused_loss = true\nloss_chunk_tokens = 16\n"))
          ->parts());
  const MemoryPlan whole =
      plan_memory(test::make_session(recipe(dir, model, "fused_loss = false\n"))->parts());
  const int64_t logits = int64_t{4} * 128 * 16384;
  EXPECT_GE(whole.device_peak - fused.device_peak, logits / 2)
      << "whole " << whole.device_peak << " fused " << fused.device_peak;
}

}  // namespace
}  // namespace tightfit
