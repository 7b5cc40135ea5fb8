// The feed-forward in tiles ([run] mlp_tile_tokens, the host's
// tiled_over_tokens, ABI 1.29), its norms with it: the same loss and
// gradients as the whole feed-forward, trained, frozen under LoRA,
// checkpointed, and with Gemma 2's norms on both sides; its
// intermediate one tile wide in what a pass holds; the plan follows; a model
// that cannot tile is refused.
#include <gtest/gtest.h>

#include "memory_accounting.hpp"
#include "memory_plan.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

// A small llama whose feed-forward dominates: 1,024 intermediate features
// against 32 hidden ones.
const char* kLlama =
    "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
    "n_kv_head = 2\nintermediate_size = 1024\nmax_positions = 64\ntie_embeddings = false\n";

std::string recipe(const test::TempDir& dir, const std::string& run, const std::string& extra = "",
                   const std::string& model = kLlama) {
  std::string r = test::tiny_recipe(test::write_corpus(dir), dir.str(), "", extra);
  const auto begin = r.find("[model]"), end = r.find("[data]");
  r.replace(begin, end - begin, "[model]\n" + model + "\n");
  r.replace(r.find("[run]\n"), 6, "[run]\n" + run);
  return r;
}

struct Pass {
  double loss = 0;
  std::map<std::string, at::Tensor> grads;
  int64_t activations_peak = 0;  // the activations category's peak in the pass
  int64_t peak_above_start = 0;  // tracked bytes at the pass's peak, above its start
};

Pass one_pass(Session& s) {
  auto batch = s.data().batcher().next();
  auto& acct = MemoryAccounting::instance();
  const int64_t start = acct.snapshot().total_current;
  acct.reset_peaks();
  const PassResult r = s.executor().run_pass(batch.tokens, batch.targets, /*backward=*/true, 1.0);
  Pass out;
  out.loss = r.loss;
  out.activations_peak = acct.snapshot().peak[TF_MEM_ACTIVATIONS];
  out.peak_above_start = acct.snapshot().total_peak - start;

  for (const Param& p : s.store().all())
    if (p.value.grad().defined()) out.grads[p.name] = p.value.grad().clone();
  return out;
}

struct Stack {
  const char* name;
  const char* strategies;
  const char* model = kLlama;
};

// Gemma 2 (its attention capped and windowed): a norm before and after the
// feed-forward, both in the tiles, their weights trained.
const char* kGemma2 =
    "plugin = \"llama\"\nconfig = \"" TIGHTFIT_SOURCE_DIR "/tests/fixtures/gemma2-tiny\"\n";

const Stack kStacks[] = {
    {"full", ""},
    {"lora_on_the_mlp",
     "[[strategy]]\nplugin = \"lora\"\ntargets = [\"gate\", \"up\", \"down\"]\nrank = 4\n"},
    // The feed-forward frozen: only its input's gradient flows through the tiles.
    {"lora_on_attention", "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"v\"]\nrank = 4\n"},
    {"checkpointed",
     "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"gate\", \"down\"]\nrank = 4\n"
     "[[strategy]]\nplugin = \"checkpoint\"\n"},
    {"gemma2_sandwich_norms", "", kGemma2},
};

class TiledMlpStacks : public ::testing::TestWithParam<Stack> {};

// Tiles of 7 tokens (the last one short) of the batch's 4 x 32: fp32
// gradients within 1e-5 of their largest value (the tiles' sums in another
// order), the loss within 1e-6.
TEST_P(TiledMlpStacks, GradientsEqualTheWholeFeedForward) {
  test::TempDir dir;
  const Stack& stack = GetParam();
  auto tiled =
      test::make_session(recipe(dir, "mlp_tile_tokens = 7\n", stack.strategies, stack.model));
  auto whole = test::make_session(recipe(dir, "", stack.strategies, stack.model));
  const Pass a = one_pass(*whole), b = one_pass(*tiled);
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(a.loss));
  test::expect_same_grads(a.grads, b.grads, 1e-5);
  // The evaluation loss (no gradients) runs the tiles once each.
  auto batch = tiled->data().batcher().validation(0);
  at::NoGradGuard no_grad;
  EXPECT_NEAR(tiled->executor().forward_loss(batch.tokens, batch.targets, false).item<double>(),
              whole->executor().forward_loss(batch.tokens, batch.targets, false).item<double>(),
              1e-5);
}

INSTANTIATE_TEST_SUITE_P(Stacks, TiledMlpStacks, ::testing::ValuesIn(kStacks),
                         [](const auto& info) { return std::string(info.param.name); });

// Under bf16 autocast (on for a stage's forward and recompute, off in
// backward) the tiles run again in backward in the forward's dtypes, as
// torch.utils.checkpoint restores autocast: the gradients are the whole
// feed-forward's within bf16 rounding (measured up to 4e-3 of the largest;
// that rounding also hides which dtype the rerun used, so the state is
// restored by construction, not told apart here).
TEST(TiledMlp, UnderAutocastTheGradientsAreTheWholeOnesWithinBf16Rounding) {
  test::TempDir dir;
  const std::string stack =
      "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"v\"]\nrank = 4\n"
      "[[strategy]]\nplugin = \"precision\"\n";
  auto tiled = test::make_session(recipe(dir, "mlp_tile_tokens = 7\n", stack));
  auto whole = test::make_session(recipe(dir, "", stack));
  const Pass a = one_pass(*whole), b = one_pass(*tiled);
  EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(a.loss));
  test::expect_same_grads(a.grads, b.grads, 1e-2);
}

// 128 tokens through a 1,024-wide feed-forward keep 4 x 128 x 1024 x 4 B =
// 2 MiB per block whole; in tiles of 16 tokens a block keeps none of it and
// computes 1/8 of it at a time. The pass's activations peak falls by more
// than half, and the plan's by about as much as measured.
TEST(TiledMlp, ThePassAndThePlanHoldOneTileOfTheIntermediate) {
  test::TempDir dir;
  const std::string full_ft = "";
  auto tiled = test::make_session(recipe(dir, "mlp_tile_tokens = 16\n", full_ft));
  auto whole = test::make_session(recipe(dir, "", full_ft));
  const MemoryPlan tiled_plan = plan_memory(tiled->parts());
  const MemoryPlan whole_plan = plan_memory(whole->parts());
  const Pass a = one_pass(*whole), b = one_pass(*tiled);
  EXPECT_LT(b.activations_peak * 2, a.activations_peak)
      << "tiled " << b.activations_peak << " whole " << a.activations_peak;
  // What the pass holds at its peak, against the plan's device peak: the
  // tile's intermediates and their gradients count in backward's workspace.
  const double measured_saving = static_cast<double>(a.peak_above_start - b.peak_above_start);
  const double planned_saving =
      static_cast<double>(whole_plan.device_peak - tiled_plan.device_peak);
  EXPECT_NEAR(planned_saving, measured_saving, 0.15 * measured_saving)
      << "planned peak: whole " << whole_plan.device_peak << " tiled " << tiled_plan.device_peak
      << "; measured above the pass's start: whole " << a.peak_above_start << " tiled "
      << b.peak_above_start;
  // What the tiled pass holds beyond the weights and the optimizer's state
  // (not there in a lone pass), planned within 10%.
  const auto& held = tiled_plan.at_peak[TF_TIER_DEVICE];
  const double planned_pass =
      static_cast<double>(tiled_plan.device_peak - held[TF_MEM_WEIGHTS] - held[TF_MEM_OPTIMIZER]);
  EXPECT_NEAR(planned_pass, static_cast<double>(b.peak_above_start), 0.1 * b.peak_above_start);
}

// Long context's stack in miniature: a bf16 model, LoRA on the attention
// (the feed-forward frozen), every block checkpointed, one row of 1,024
// tokens in tiles of 128. Its norms go with the tiles (their input and
// output are one tile's, in forward and in backward), so a block keeps the
// residual stream once for its feed-forward; what the pass holds at its
// peak is planned within 10%.
TEST(TiledMlp, ABf16LoRAPassHoldsWhatThePlanSays) {
  test::TempDir dir;
  const std::string model =
      "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 256\nn_head = 4\n"
      "n_kv_head = 2\nintermediate_size = 512\nmax_positions = 1024\ndtype = \"bf16\"\n";
  const std::string stack =
      "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"k\", \"v\", \"o\"]\nrank = 4\n"
      "[[strategy]]\nplugin = \"checkpoint\"\n";
  std::string r = recipe(dir, "mlp_tile_tokens = 128\n", stack, model);
  r.replace(r.find("seq_len = 32\nbatch_size = 4"), 28, "seq_len = 1024\nbatch_size = 1");
  auto tiled = test::make_session(r);
  const MemoryPlan plan = plan_memory(tiled->parts());
  const Pass pass = one_pass(*tiled);
  const auto& held = plan.at_peak[TF_TIER_DEVICE];
  const double planned_pass =
      static_cast<double>(plan.device_peak - held[TF_MEM_WEIGHTS] - held[TF_MEM_OPTIMIZER]);
  EXPECT_NEAR(planned_pass, static_cast<double>(pass.peak_above_start),
              0.1 * pass.peak_above_start);
}

// A model that does not declare TF_MODEL_FEATURE_TILED_MLP would run its
// feed-forward whole: refused, naming the key and the fix.
TEST(TiledMlp, AModelThatCannotTileIsRefused) {
  test::TempDir dir;
  const std::string gpt2 =
      "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 2\n"
      "n_positions = 64\n";
  const std::string error = test::recipe_error(recipe(dir, "mlp_tile_tokens = 16\n", "", gpt2));
  EXPECT_NE(error.find("mlp_tile_tokens = 16"), std::string::npos) << error;
  EXPECT_NE(error.find("TF_MODEL_FEATURE_TILED_MLP"), std::string::npos) << error;
  EXPECT_NE(error.find("set mlp_tile_tokens = 0"), std::string::npos) << error;
}

}  // namespace
}  // namespace tightfit
