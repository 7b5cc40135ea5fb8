// The memory planner against what runs measure: the models' declared
// activation bytes, the predicted peak of recipes across the three models and
// the strategies and schedules (within the field notes' ±10%), and clear
// answers for what it cannot plan.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>

#include "memory_plan.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

const char* kGpt2 =
    "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 256\nn_head = 4\n"
    "n_positions = 128\n";
const char* kLlama =
    "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 256\nn_head = 4\n"
    "n_kv_head = 2\nintermediate_size = 688\nmax_positions = 128\n";
// The model's own weights in bf16, as QLoRA recipes keep them: it declares
// 16-bit activations, which autocast must not shrink again.
const char* kLlamaBf16 =
    "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 256\nn_head = 4\n"
    "n_kv_head = 2\nintermediate_size = 688\nmax_positions = 128\ndtype = \"bf16\"\n";
const char* kRwkv = "plugin = \"rwkv\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 192\n";
// A vocabulary far larger than the byte tokenizer's, tied: the head's
// logits and their gradients dominate.
const char* kLlamaBigVocab =
    "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 256\nn_head = 4\n"
    "n_kv_head = 2\nintermediate_size = 688\nmax_positions = 128\nvocab_size = 32000\n"
    "tie_embeddings = true\n";

std::string recipe(const std::string& out, const std::string& model, const std::string& schedule,
                   const std::string& strategies) {
  return "[run]\nname = \"p\"\nseed = 1\nsteps = 3\nlog_every = 1000\nsample_tokens = 0\n"
         "eval_batches = 1\nout_dir = \"" +
         out + "\"\n[model]\n" + model +
         "[data]\ncorpus = \"builtin:fortunes\"\ntokenizer = \"byte\"\nseq_len = 128\n"
         "batch_size = 8\n[optimizer]\nname = \"adamw\"\nlr = 1e-3\n[schedule]\n" +
         (schedule.empty() ? "plugin = \"standard\"\nwarmup_steps = 1\n" : schedule) + strategies;
}

MemoryPlan plan_of(const std::string& text) {
  SessionOptions dry;
  dry.dry_run = true;
  auto s = test::make_session(text, dry);
  return plan_memory(*s);
}

double relative(int64_t predicted, int64_t measured) {
  return static_cast<double>(predicted - measured) / static_cast<double>(measured);
}

struct ActivationCase {
  const char* name;
  const char* model;
};

class DeclaredActivations : public ::testing::TestWithParam<ActivationCase> {};

// What a model declares per stage is what autograd keeps: the activations
// alive at the end of forward, summed over stages, at fp32 and bf16.
TEST_P(DeclaredActivations, MatchWhatAutogradKeeps) {
  for (const char* dtype : {"fp32", "bf16"}) {
    test::TempDir dir;
    const std::string text =
        recipe(dir.str(), std::string(GetParam().model) + "dtype = \"" + dtype + "\"\n", "", "");
    const MemoryPlan plan = plan_of(text);
    const TrainSummary sum = test::make_session(text)->train();
    const int64_t measured = sum.memory.peak[TF_MEM_ACTIVATIONS];
    const int64_t declared = plan.device_peak_by_category[TF_MEM_ACTIVATIONS];
    EXPECT_LE(std::abs(relative(declared, measured)), 0.03)
        << GetParam().name << " " << dtype << ": declared " << declared << ", measured "
        << measured;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DeclaredActivations,
                         ::testing::Values(ActivationCase{"gpt2", kGpt2},
                                           ActivationCase{"llama", kLlama},
                                           ActivationCase{"rwkv", kRwkv}),
                         [](const auto& info) { return std::string(info.param.name); });

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
// run's measured peak of tracked memory less the data: within ±10%, and the
// categories nothing estimates by rule (weights, gradients, optimizer state)
// within 2% of their measured peaks.
TEST_P(PlannedPeak, IsWithinTenPercentOfTheMeasuredPeak) {
  const PeakCase& c = GetParam();
  test::TempDir dir;
  const std::string text = recipe(dir.str(), c.model, c.schedule, c.strategies);
  const MemoryPlan plan = plan_of(text);
  EXPECT_TRUE(plan.unestimated.empty());
  const TrainSummary sum = test::make_session(text)->train();
  const int64_t measured = sum.memory.total_peak - sum.memory.peak[TF_MEM_OTHER];
  EXPECT_LE(std::abs(relative(plan.tracked_peak, measured)), 0.10)
      << c.name << ": planned " << format_bytes(plan.tracked_peak) << " (" << plan.peak_moment
      << "), measured " << format_bytes(measured);
  // The safe budget the plan reports (plus the data) is never passed by a
  // step: a run with that budget would not have stopped.
  EXPECT_LE(measured, plan.safe_budget())
      << c.name << ": measured " << format_bytes(measured) << " over the safe budget "
      << format_bytes(plan.safe_budget());
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

const char* kStandard = "";
INSTANTIATE_TEST_SUITE_P(
    Recipes, PlannedPeak,
    ::testing::Values(
        PeakCase{"gpt2", kGpt2, kStandard, ""}, PeakCase{"llama", kLlama, kStandard, ""},
        PeakCase{"rwkv", kRwkv, kStandard, ""},
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

TEST(Plan, NamesAPluginWithNoEstimateInsteadOfGuessing) {
  test::TempDir dir;
  std::string text = recipe(dir.str(), kGpt2, "plugin = \"fixture_good\"\n", "");
  text.replace(text.find("[run]\n"), 6,
               std::string("[run]\nplugin_paths = [\"") + TIGHTFIT_FIXTURE_DIR + "\"]\n");
  const MemoryPlan plan = plan_of(text);
  ASSERT_EQ(plan.unestimated.size(), 1u);
  EXPECT_EQ(plan.unestimated[0], "schedule fixture_good");
  const std::string path = test::write_file(dir, "r.toml", text);
  std::string out;
  EXPECT_EQ(test::run_tightfit("plan " + path, &out), 0) << out;
  EXPECT_NE(out.find("fixture_good: has no estimate_memory hook; its effect is NOT in this plan"),
            std::string::npos)
      << out;
}

TEST(Plan, SaysWhetherABudgetFits) {
  test::TempDir dir;
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), kGpt2, kStandard, ""));
  std::string out;
  EXPECT_EQ(test::run_tightfit("plan " + path + " --budget 64GiB", &out), 0) << out;
  EXPECT_NE(out.find("fits,"), std::string::npos) << out;
  EXPECT_NE(out.find("safe budget   "), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("plan " + path + " --budget 1MiB", &out), 3) << out;
  EXPECT_NE(out.find("does NOT fit"), std::string::npos) << out;
  // Between the planned peak and the safe budget: not "fits", but tight.
  const MemoryPlan plan = plan_of(recipe(dir.str(), kGpt2, kStandard, ""));
  const int64_t between = (plan.tracked_peak + plan.safe_budget()) / 2;
  EXPECT_EQ(test::run_tightfit("plan " + path + " --budget " + std::to_string(between), &out), 0)
      << out;
  EXPECT_NE(out.find("tight: the plan fits"), std::string::npos) << out;
  EXPECT_EQ(out.find("fits,"), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("plan " + path + " --budget lots", &out), 2) << out;
  EXPECT_NE(out.find("--budget"), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("plan " + (dir.path() / "missing.toml").string(), &out), 2) << out;
}

// The fit table: its largest batch is the largest whose plan fits the card.
TEST(Plan, GpuTableGivesTheLargestBatchThatFits) {
  test::TempDir dir;
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), kGpt2, kStandard, ""));
  std::string out;
  ASSERT_EQ(test::run_tightfit("plan " + path + " --gpus 3070", &out), 0) << out;
  const size_t row = out.find("RTX 3070 8GB");
  ASSERT_NE(row, std::string::npos) << out;
  std::istringstream fields(out.substr(row + std::string("RTX 3070 8GB").size()));
  std::string usable, fits, headroom;
  int64_t batch = 0;
  fields >> usable >> fits >> headroom >> batch;
  EXPECT_EQ(fits, "yes") << out;
  ASSERT_GT(batch, 8) << out;
  const int64_t card = static_cast<int64_t>((8 * 0.95 - 0.5) * 1024 * 1024 * 1024);
  auto peak_at = [&](int64_t b) {
    std::string json;
    EXPECT_EQ(test::run_tightfit("plan " + path + " --json --set data.batch_size=" +
                                     std::to_string(b) + " 2>/dev/null",
                                 &json),
              0)
        << json;
    const size_t at = json.find("\"device_peak\": ");
    return std::stoll(json.substr(at + 15));
  };
  EXPECT_LE(peak_at(batch), card);
  EXPECT_GT(peak_at(batch + 1), card);
  EXPECT_EQ(test::run_tightfit("plan " + path + " --gpus 9090", &out), 2);
  EXPECT_NE(out.find("unknown GPU \"9090\"; known: 3060"), std::string::npos) << out;
}

TEST(Plan, RunPrintsThePlanNextToTheMeasuredPeak) {
  test::TempDir dir;
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), kGpt2, kStandard, ""));
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + path + " -q", &out), 0) << out;
  const size_t at = out.find("planned peak  ");
  ASSERT_NE(at, std::string::npos) << out;
  // "+1.2% against the measured ..." within the ten percent.
  const size_t pct = out.find('%', at);
  ASSERT_NE(pct, std::string::npos);
  const size_t start = out.rfind(' ', pct) + 1;
  const double err = std::strtod(out.substr(start, pct - start).c_str(), nullptr);
  EXPECT_LE(std::abs(err), 10.0) << out.substr(at, 120);
}

}  // namespace
}  // namespace tightfit
