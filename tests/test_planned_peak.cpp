// The planned peak of whole recipes against their runs, across the three
// models, the strategies and the schedules: within the field notes' ±10%.
// scripts/gpu-check runs it again on the GPU (label cuda), where the caching
// allocator measures the peak.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>

#include "plan_recipes.hpp"

namespace tightfit {
namespace {

using test::kGpt2;
using test::kLlama;
using test::kLlamaBf16;
using test::kLlamaBigVocab;
using test::kRwkv;
using test::plan_of;
using test::recipe;
using test::relative;

struct PeakCase {
  const char* name;
  const char* model;
  const char* schedule;
  const char* strategies;
  // Offloaded weights come back into memory as weights while their stage
  // runs; the plan counts that traffic as workspace, so only the total compares.
  bool weights_category = true;
};

class PlannedPeak : public ::testing::TestWithParam<PeakCase> {};

// The planned peak (from the recipe alone, nothing allocated) against the
// run's measured peak less the data: within ±10%, and the categories nothing
// estimates by rule (weights, gradients, optimizer state) within 2% of their
// measured peaks. On the CPU the measured peak is the counting allocator's
// (tracked memory, by category); on a GPU it is the caching allocator's
// peak of allocated bytes, which has no categories.
TEST_P(PlannedPeak, IsWithinTenPercentOfTheMeasuredPeak) {
  const PeakCase& c = GetParam();
  test::TempDir dir;
  const std::string text =
      recipe(dir.str(), c.model, c.schedule, c.strategies, test::test_device());
  const MemoryPlan plan = plan_of(text);
  EXPECT_TRUE(plan.unestimated.empty());
  const TrainSummary sum = test::make_session(text)->train();
  const bool on_gpu = sum.memory.device_peak > 0;
  const int64_t measured =
      on_gpu ? sum.memory.device_peak : sum.memory.total_peak - sum.memory.peak[TF_MEM_OTHER];
  EXPECT_LE(std::abs(relative(plan.tracked_peak, measured)), 0.10)
      << c.name << ": planned " << format_bytes(plan.tracked_peak) << " (" << plan.peak_moment
      << "), measured " << format_bytes(measured) << "; at the peak, planned/measured:" << [&] {
           std::string by;
           for (int k = 0; k < TF_MEM_CATEGORY_COUNT - 1; ++k)
             by += std::string(" ") + category_name(static_cast<tf_mem_category>(k)) + " " +
                   format_bytes(plan.at_peak[TF_TIER_DEVICE][k]) + "/" +
                   format_bytes(sum.memory.at_peak[k]);
           return by;
         }();
  // The safe budget the plan reports (plus the data) is never passed by a
  // step: a run with that budget would not have stopped.
  EXPECT_LE(measured, plan.safe_budget())
      << c.name << ": measured " << format_bytes(measured) << " over the safe budget "
      << format_bytes(plan.safe_budget());
  if (on_gpu) return;
  for (tf_mem_category k : {TF_MEM_WEIGHTS, TF_MEM_GRADS, TF_MEM_OPTIMIZER}) {
    if (k == TF_MEM_WEIGHTS && !c.weights_category) continue;
    const int64_t want = sum.memory.peak[k], got = plan.device_peak_by_category[k];
    if (want < (1 << 20)) {
      EXPECT_LT(got, 1 << 20) << c.name << " " << category_name(k);
      continue;
    }
    EXPECT_LE(std::abs(relative(got, want)), 0.02)
        << c.name << " " << category_name(k) << ": planned " << got << ", measured " << want;
  }
}

// Gemma 2 (capped attention spelled out, sandwich norms, the capped fused
// head) and Phi-3 (fused projections, partial rotary) at kLlama's scale.
const char* kGemma2 =
    "plugin = \"llama\"\nconfig = \"" TIGHTFIT_SOURCE_DIR
    "/tests/fixtures/gemma2-tiny\"\nn_layer = 4\nn_embd = 256\nn_head = 4\nn_kv_head = 2\n"
    "head_dim = 64\nintermediate_size = 688\nmax_positions = 128\n";
const char* kPhi3 =
    "plugin = \"llama\"\nconfig = \"" TIGHTFIT_SOURCE_DIR
    "/tests/fixtures/phi3-tiny\"\nn_layer = 4\nn_embd = 256\nn_head = 32\nn_kv_head = 8\n"
    "intermediate_size = 688\nmax_positions = 128\n";

// Mixtures of experts at the same scale: Mixtral's 4 experts, 2 a token, in
// every block; Qwen2-MoE's experts with the shared one in the even blocks
// (mlp_only_layers keeps layer 1 dense, and 3 with the override's rule).
const char* kMixtral =
    "plugin = \"llama\"\nconfig = \"" TIGHTFIT_SOURCE_DIR
    "/tests/fixtures/mixtral-tiny\"\nn_layer = 4\nn_embd = 256\nn_head = 4\nn_kv_head = 2\n"
    "intermediate_size = 344\nmax_positions = 128\n";
const char* kQwen2Moe =
    "plugin = \"llama\"\nconfig = \"" TIGHTFIT_SOURCE_DIR
    "/tests/fixtures/qwen2-moe-tiny\"\nn_layer = 4\nn_embd = 256\nn_head = 4\nn_kv_head = 2\n"
    "intermediate_size = 688\nmax_positions = 128\n";

const char* kStandard = "";
INSTANTIATE_TEST_SUITE_P(
    Recipes, PlannedPeak,
    ::testing::Values(
        PeakCase{"gpt2", kGpt2, kStandard, ""}, PeakCase{"llama", kLlama, kStandard, ""},
        PeakCase{"rwkv", kRwkv, kStandard, ""}, PeakCase{"gemma2", kGemma2, kStandard, ""},
        PeakCase{"phi3_lora", kPhi3, kStandard, "[[strategy]]\nplugin = \"lora\"\n"},
        PeakCase{"mixtral", kMixtral, kStandard, ""},
        PeakCase{"qwen2_moe_qlora", kQwen2Moe, kStandard,
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"
                 "targets = [\"q\", \"v\"]\n"},
        // LoRA on every expert too: each adapter keeps its input for the tokens routed to
        // its expert (routed_share, ABI 1.17), top_k copies of each token a layer (planned
        // 10% under when every adapter was counted for every token, once per width).
        PeakCase{"qwen2_moe_qlora_experts", kQwen2Moe, kStandard,
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"
                 "targets = [\"q\", \"v\", \"gate\", \"up\", \"down\"]\n"},
        PeakCase{"mixtral_lora_experts", kMixtral, kStandard,
                 "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"v\", \"gate\", \"up\", "
                 "\"down\"]\n"},
        // Experts left on disk and read one by one when routed to (ABI 1.15).
        PeakCase{"mixtral_qlora_offload_disk", kMixtral, kStandard,
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"
                 "[[strategy]]\nplugin = \"offload\"\nparams = \"disk\"\n",
                 false},
        PeakCase{"llama_big_vocab", kLlamaBigVocab, kStandard, ""},
        PeakCase{"llama_big_vocab_lora_autocast", kLlamaBigVocab, kStandard,
                 "[[strategy]]\nplugin = \"lora\"\n[[strategy]]\nplugin = \"precision\"\n"},
        PeakCase{"gpt2_checkpoint", kGpt2, kStandard, "[[strategy]]\nplugin = \"checkpoint\"\n"},
        PeakCase{"llama_checkpoint", kLlama, kStandard, "[[strategy]]\nplugin = \"checkpoint\"\n"},
        PeakCase{"rwkv_checkpoint", kRwkv, kStandard, "[[strategy]]\nplugin = \"checkpoint\"\n"},
        PeakCase{"gpt2_lora", kGpt2, kStandard,
                 "[[strategy]]\nplugin = \"lora\"\ntargets = [\"c_attn\"]\n"},
        PeakCase{"rwkv_lora", kRwkv, kStandard,
                 "[[strategy]]\nplugin = \"lora\"\ntargets = [\"key\", \"value\"]\n"},
        PeakCase{"llama_qlora", kLlama, kStandard,
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"},
        // Frozen blocks recomputed: their backward's gradients (declared) make the peak.
        PeakCase{"llama_qlora_checkpoint", kLlama, kStandard,
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"
                 "[[strategy]]\nplugin = \"checkpoint\"\n"},
        // The inputs recomputed stages keep, on disk until their backward.
        PeakCase{"llama_lora_checkpoint_activations_disk", kLlama, kStandard,
                 "[[strategy]]\nplugin = \"lora\"\n[[strategy]]\nplugin = \"checkpoint\"\n"
                 "[[strategy]]\nplugin = \"offload\"\nparams = \"none\"\n"
                 "activations = \"disk\"\n"},
        PeakCase{"gpt2_lora_checkpoint", kGpt2, kStandard,
                 "[[strategy]]\nplugin = \"lora\"\ntargets = [\"c_attn\"]\n"
                 "[[strategy]]\nplugin = \"checkpoint\"\n"},
        PeakCase{"rwkv_lora_checkpoint", kRwkv, kStandard,
                 "[[strategy]]\nplugin = \"lora\"\ntargets = [\"key\", \"value\"]\n"
                 "[[strategy]]\nplugin = \"checkpoint\"\n"},
        PeakCase{"llama_lora_offload_disk", kLlama, kStandard,
                 "[[strategy]]\nplugin = \"lora\"\n[[strategy]]\nplugin = \"offload\"\n"
                 "params = \"disk\"\nprefetch = 2\n",
                 false},
        PeakCase{"llama_qlora_offload_disk", kLlama, kStandard,
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"
                 "[[strategy]]\nplugin = \"offload\"\nparams = \"disk\"\n",
                 false},
        PeakCase{"llama_qlora_bf16", kLlama, kStandard,
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"
                 "[[strategy]]\nplugin = \"precision\"\nmode = \"bf16\"\n"},
        // Planned 16% under when autocast shrank its 16-bit activations again.
        PeakCase{"llama_bf16_weights_qlora_autocast", kLlamaBf16, kStandard,
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"
                 "[[strategy]]\nplugin = \"precision\"\n"},
        PeakCase{"gpt2_offload_optimizer", kGpt2, kStandard,
                 "[[strategy]]\nplugin = \"offload\"\nparams = \"none\"\noptimizer = \"host\"\n"},
        PeakCase{"gpt2_fused_update", kGpt2, kStandard,
                 "[[strategy]]\nplugin = \"fused_update\"\n"},
        PeakCase{"gpt2_autocast", kGpt2, kStandard, "[[strategy]]\nplugin = \"precision\"\n"},
        PeakCase{"gpt2_adamw8", kGpt2, kStandard, "[[strategy]]\nplugin = \"adamw8\"\n"},
        PeakCase{"llama_bf16", kLlama, kStandard,
                 "[[strategy]]\nplugin = \"precision\"\nmode = \"bf16\"\n"},
        PeakCase{"llama_sparse_skip", kLlama, kStandard,
                 "[[strategy]]\nplugin = \"sparse\"\nfirst = 1\nlast = 1\nmiddle = \"skip\"\n"},
        PeakCase{"llama_lisa", kLlama, kStandard,
                 "[[strategy]]\nplugin = \"sparse\"\nfirst = 1\nlast = 1\nmiddle = \"lisa\"\n"
                 "k = 1\n"},
        PeakCase{"gpt2_accumulate", kGpt2,
                 "plugin = \"accumulate\"\nmicro_batches = 2\nwarmup_steps = 1\n", ""},
        PeakCase{"gpt2_mezo", kGpt2, "plugin = \"mezo\"\nwarmup_steps = 1\n", ""},
        // The predictor's copy of the weights from before a step lives only in the update.
        PeakCase{"gpt2_hybrid", kGpt2,
                 "plugin = \"hybrid\"\nwarmup_full_steps = 0\nfull_steps = 1\n", ""}),
    [](const auto& info) { return std::string(info.param.name); });

// Online RL (grpo): the training pass has the schedule's own shape (a
// batch's prompts x num_generations rows of prompt + completion) and the
// generation is a moment of its own (the decode cache of a batch's
// completions), both planned from the recipe (ABI 1.26, 1.27).
struct GrpoCase {
  const char* name;
  const char* model;
  const char* schedule;  // keys after plugin = "grpo"
  const char* strategies;
};

class GrpoPlannedPeak : public ::testing::TestWithParam<GrpoCase> {};

std::string grpo_recipe(const std::string& dir, const GrpoCase& c) {
  {
    std::ofstream rows(dir + "/prompts.jsonl");
    for (int i = 0; i < 12; ++i)  // 43 bytes each: every batch is the longest the plan sizes
      rows << "{\"prompt\": \"" << std::string(43, static_cast<char>('a' + i)) << "\"}\n";
  }
  return "[run]\nname = \"p\"\nseed = 1\nsteps = 2\nlog_every = 1000\nsample_tokens = 0\n"
         "eval_batches = 0\nout_dir = \"" +
         dir + "\"\n[model]\n" + c.model + "[data]\ncorpus = \"" + dir +
         "/prompts.jsonl\"\ntokenizer = \"byte\"\nbatch_size = 2\nval_fraction = 0\n"
         "[optimizer]\nname = \"adamw\"\nlr = 1e-3\n[schedule]\nplugin = \"grpo\"\n" +
         c.schedule + "\n[[reward]]\nplugin = \"length\"\ntarget = 8\n" + c.strategies;
}

TEST_P(GrpoPlannedPeak, CountsTheGenerationAndThePassItsRowsMake) {
  const GrpoCase& c = GetParam();
  test::TempDir dir;
  std::string text = grpo_recipe(dir.str(), c);
  if (const std::string device = test::test_device(); !device.empty())
    text.replace(text.find("[run]\n"), 6, "[run]\ndevice = \"" + device + "\"\n");
  const MemoryPlan plan = plan_of(text);
  EXPECT_TRUE(plan.unestimated.empty()) << plan.unestimated.front();
  // 2 prompts x num_generations rows, each the longest prompt (43 byte
  // tokens) and max_completion_length; the batch's completions decoded at
  // once, each prompt prefilled once (llama and rwkv fan a cache out).
  auto key = [&](const std::string& name) {
    const size_t at = text.find(name + " = ");
    return std::stoll(text.substr(at + name.size() + 3));
  };
  const int64_t G = key("num_generations"), C = key("max_completion_length");
  EXPECT_EQ(plan.batch_size, 2 * G);
  EXPECT_EQ(plan.seq_len, 43 + C);
  EXPECT_EQ(plan.generation.rows, 2 * G);
  EXPECT_EQ(plan.generation.prefill_rows, plan.generation.incremental ? 2 : 2 * G);
  EXPECT_EQ(plan.generation.prompt_tokens, 43);
  EXPECT_EQ(plan.generation.new_tokens, C);
  const TrainSummary sum = test::make_session(text)->train();
  // On a GPU, the caching allocator's peak of allocated bytes (as PlannedPeak).
  const int64_t measured = sum.memory.device_peak > 0
                               ? sum.memory.device_peak
                               : sum.memory.total_peak - sum.memory.peak[TF_MEM_OTHER];
  std::string by;  // at the peak, planned/measured
  for (int k = 0; k < TF_MEM_CATEGORY_COUNT - 1; ++k)
    by += std::string(" ") + category_name(static_cast<tf_mem_category>(k)) + " " +
          format_bytes(plan.at_peak[TF_TIER_DEVICE][k]) + "/" + format_bytes(sum.memory.at_peak[k]);
  std::cout << c.name << ": planned " << format_bytes(plan.tracked_peak) << " (" << plan.peak_moment
            << "; generation " << format_bytes(plan.generation.bytes()) << "), measured "
            << format_bytes(measured) << ", " << relative(plan.tracked_peak, measured) * 100
            << "%; at the peak, planned/measured:" << by << "\n";
  EXPECT_LE(std::abs(relative(plan.tracked_peak, measured)), 0.10) << c.name;
  EXPECT_LE(measured, plan.safe_budget());
}

const char* kGrpoShort = "num_generations = 4\nmax_completion_length = 16\n";
INSTANTIATE_TEST_SUITE_P(
    Recipes, GrpoPlannedPeak,
    ::testing::Values(
        GrpoCase{"llama_lora", kLlama, kGrpoShort, "[[strategy]]\nplugin = \"lora\"\n"},
        // The reference (adapters off) and old log-probs: forward passes without gradients.
        GrpoCase{"llama_lora_beta_iterations", kLlama,
                 "num_generations = 4\nmax_completion_length = 16\nbeta = 0.04\n"
                 "num_iterations = 2\n",
                 "[[strategy]]\nplugin = \"lora\"\n"},
        // A full fine-tune's reference: the kernel's copy of the starting weights.
        GrpoCase{"gpt2_full_beta", kGpt2,
                 "num_generations = 4\nmax_completion_length = 16\nbeta = 0.04\n", ""},
        // A recurrent state, not a growing cache.
        GrpoCase{"rwkv_lora", kRwkv, kGrpoShort,
                 "[[strategy]]\nplugin = \"lora\"\ntargets = [\"key\", \"value\"]\n"},
        // Recomputed blocks keep little, so the generation's many long rows
        // and the big vocabulary's logits weigh more.
        GrpoCase{"llama_big_vocab_qlora_checkpoint_long", kLlamaBigVocab,
                 "num_generations = 8\nmax_completion_length = 64\n",
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"
                 "[[strategy]]\nplugin = \"checkpoint\"\n"},
        // Sixteen rows of each of two prompts: 32 rows decoded at once (each
        // prompt prefilled once, so the prompt's logits no longer make the
        // peak, as they did when every row was prefilled).
        GrpoCase{"llama_big_vocab_qlora_checkpoint_wide", kLlamaBigVocab,
                 "num_generations = 16\nmax_completion_length = 32\n",
                 "[[strategy]]\nplugin = \"quantize\"\n[[strategy]]\nplugin = \"lora\"\n"
                 "[[strategy]]\nplugin = \"checkpoint\"\n"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tightfit
