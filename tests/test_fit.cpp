// `tightfit fit` and the step-time cost model: the model's parts move the
// way the strategies change the work (recompute, frozen weights, tiers,
// micro-batches), and the command finds stacks that fit, writes a recipe
// that plans within the budget, prefers exact stacks for quality, says so
// when nothing fits, and --verify runs what it chose.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "byte_size.hpp"
#include "executor.hpp"
#include "file_util.hpp"
#include "fit_rank.hpp"
#include "fit_search.hpp"
#include "memory_plan.hpp"
#include "recipe.hpp"
#include "session.hpp"
#include "step_cost.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

const char* kGpt2 =
    "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 256\nn_head = 4\n"
    "n_positions = 128\n";

std::string recipe(const std::string& out, const std::string& strategies, int64_t batch_size = 8,
                   const std::string& schedule = "") {
  return "[run]\nname = \"f\"\nseed = 1\nsteps = 3\nlog_every = 1000\nsample_tokens = 0\n"
         "eval_batches = 1\nout_dir = \"" +
         out + "\"\n[model]\n" + kGpt2 +
         "[data]\ncorpus = \"builtin:fortunes\"\ntokenizer = \"byte\"\nseq_len = 128\n"
         "batch_size = " +
         std::to_string(batch_size) + "\n[optimizer]\nname = \"adamw\"\nlr = 1e-3\n[schedule]\n" +
         (schedule.empty() ? "plugin = \"standard\"\nwarmup_steps = 1\n" : schedule) + strategies;
}

// Round numbers, so that each part of the cost can be checked by hand.
MachineRates fixed_rates() {
  MachineRates r;
  r.fp32_flops[1024] = 1e11;
  r.bf16_flops[1024] = 4e11;
  r.memory_bytes_per_s = 4e10;
  r.host_link_bytes_per_s = 2e10;
  r.activation_fp32_bytes_per_s = r.activation_bf16_bytes_per_s = 2e9;
  r.dequant_values_per_s = 1e9;
  r.disk_read_warm = 1e9;
  r.disk_read_cold = 1e8;
  r.disk_write = 1e8;
  r.ram_available = int64_t{1} << 40;
  return r;
}

StepCost cost_of(const std::string& text, const CostOptions& options = {}) {
  SessionOptions dry;
  dry.dry_run = true;
  auto s = test::make_session(text, dry);
  const MemoryPlan plan = plan_memory(s->parts());
  return predict_step_cost(s->parts(), plan, fixed_rates(), options);
}

TEST(StepCost, CheckpointingAddsTheForwardOfTheRecomputedBlocks) {
  test::TempDir dir;
  const StepCost plain = cost_of(recipe(dir.str(), ""));
  const StepCost ckpt =
      cost_of(recipe(dir.str(), "[[strategy]]\nplugin = \"checkpoint\"\nevery = 1\n"));
  EXPECT_EQ(plain.recompute, 0);
  // Forward, input gradient and weight gradient are three equal matmul
  // passes; recomputing every block adds the blocks' forward: just under a
  // third of the matmuls (embedding and head are not recomputed).
  EXPECT_GT(ckpt.recompute, 0.2 * plain.matmul);
  EXPECT_LT(ckpt.recompute, 1.0 / 3 * plain.matmul);
  EXPECT_DOUBLE_EQ(ckpt.matmul, plain.matmul);
  EXPECT_GT(ckpt.total(), plain.total());
}

// [run] mlp_tile_tokens: each tile of the feed-forward runs again in
// backward, its matmuls priced as recompute (the model declares them:
// tf_stage_spec.tiled_flops_per_token), and the plan shows that time; a
// row no wider than the tile runs whole, at no cost.
TEST(StepCost, TiledFeedForwardComputesItsTilesAgainInBackward) {
  test::TempDir dir;
  const int64_t L = 2, C = 128, I = 384, tokens = 8 * 128;
  std::string text = recipe(dir.str(), "");
  text.replace(text.find(kGpt2), std::string(kGpt2).size(),
               "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 128\n"
               "n_head = 4\nn_kv_head = 2\nintermediate_size = 384\nmax_positions = 128\n");
  auto with_tiles = [&](int64_t tile) {
    std::string t = text;
    t.replace(t.find("[run]\n"), 6, "[run]\nmlp_tile_tokens = " + std::to_string(tile) + "\n");
    return t;
  };
  const StepCost whole = cost_of(text), tiled = cost_of(with_tiles(256));
  // The gate, up and down projections: 2 x 3 C I FLOPs a token a block, at
  // the fixed rates' 1e11 a second.
  const double again = static_cast<double>(L * 2 * 3 * C * I * tokens) / 1e11;
  EXPECT_EQ(whole.recompute, 0);
  EXPECT_NEAR(tiled.recompute, again, again * 1e-9);
  EXPECT_DOUBLE_EQ(tiled.matmul, whole.matmul);
  EXPECT_DOUBLE_EQ(cost_of(with_tiles(tokens)).recompute, 0);  // one tile: whole

  SessionOptions dry;
  dry.dry_run = true;
  auto named = [](const MemoryPlan& p) {
    for (const PlanContribution& c : p.contributions)
      if (c.plugin.rfind("feed-forward in tiles", 0) == 0) return c.time_factor;
    return 0.0;
  };
  auto s = test::make_session(with_tiles(256), dry);
  double total = 0;
  for (const StageState& st : s->parts().executor->stages()) total += st.flops_per_token;
  EXPECT_NEAR(named(plan_memory(s->parts())), 1 + L * 2 * 3 * C * I / (3 * total), 1e-12);
  EXPECT_EQ(named(plan_memory(test::make_session(with_tiles(tokens), dry)->parts())), 0);
}

TEST(StepCost, FrozenWeightsSkipTheirWeightGradientAndPayForDequantizing) {
  test::TempDir dir;
  const StepCost plain = cost_of(recipe(dir.str(), ""));
  const std::string lora = "[[strategy]]\nplugin = \"lora\"\nrank = 8\n";
  const StepCost adapters = cost_of(recipe(dir.str(), lora));
  // No weight gradients for the frozen blocks: about two thirds of the
  // matmul work (the head's tied embedding still trains).
  EXPECT_LT(adapters.matmul, 0.8 * plain.matmul);
  EXPECT_GT(adapters.matmul, 0.6 * plain.matmul);
  EXPECT_LT(adapters.update, plain.update);
  const StepCost qlora =
      cost_of(recipe(dir.str(), lora + "[[strategy]]\nplugin = \"quantize\"\nformat = \"nf4\"\n"));
  EXPECT_EQ(adapters.dequant, 0);
  // Each block's 12 C^2 weights dequantized in forward and backward.
  const double values = 4 * 12.0 * 256 * 256;
  EXPECT_NEAR(qlora.dequant, 2 * values / 1e9, 0.05 * 2 * values / 1e9);
}

TEST(StepCost, PrefetchHidesDiskReadsBehindCompute) {
  test::TempDir dir;
  const std::string base =
      "[[strategy]]\nplugin = \"lora\"\nrank = 8\n[[strategy]]\nplugin = \"offload\"\n"
      "params = \"disk\"\n";
  CostOptions none;
  const StepCost exposed = cost_of(recipe(dir.str(), base + "prefetch = 0\n"), none);
  // Every block's fp32 weights read twice (forward, backward) at 1 GB/s.
  const double bytes = 4 * 12.0 * 256 * 256 * 4;
  EXPECT_NEAR(exposed.transfer, 2 * bytes / 1e9, 0.05 * 2 * bytes / 1e9);
  CostOptions two;
  two.prefetch = 2;
  const StepCost hidden = cost_of(recipe(dir.str(), base + "prefetch = 2\n"), two);
  EXPECT_LT(hidden.transfer, exposed.transfer);
}

TEST(StepCost, MicroBatchesRepeatTheWorkOfASmallerBatch) {
  test::TempDir dir;
  const StepCost whole = cost_of(recipe(dir.str(), "", 8));
  CostOptions four;
  four.micro_batches = 4;
  const StepCost micro = cost_of(
      recipe(dir.str(), "", 2, "plugin = \"accumulate\"\nmicro_batches = 4\nwarmup_steps = 1\n"),
      four);
  // The same tokens' matmuls (the fixed rates do not depend on the rows),
  // plus the gradients summed three more times.
  EXPECT_NEAR(micro.matmul, whole.matmul, 1e-9 * whole.matmul);
  EXPECT_GT(micro.update, whole.update);
}

// The cost model prices what the plan shows; a plugin says whether that is
// all it does to step time (tf_memory_estimate.time_from_plan), so a
// third-party strategy is costed the way the built-in ones are, and the
// kernel names none of them.
TEST(StepCost, PluginsSayWhetherThePlanShowsTheirTime) {
  test::TempDir dir;
  SessionOptions dry;
  dry.dry_run = true;
  auto s = test::make_session(recipe(dir.str(),
                                     "[[strategy]]\nplugin = \"checkpoint\"\nevery = 1\n"
                                     "[[strategy]]\nplugin = \"fused_update\"\n"),
                              dry);
  MemoryPlan plan = plan_memory(s->parts());
  ASSERT_EQ(plan.contributions.size(), 3u);  // two strategies and the schedule
  for (const PlanContribution& c : plan.contributions)
    EXPECT_TRUE(c.time_from_plan) << c.plugin;  // built-in: all in the plan
  const StepCost priced = predict_step_cost(s->parts(), plan, fixed_rates(), {});
  EXPECT_EQ(priced.other, 1.0);
  // The same effect from a plugin that does not say so: its factor multiplies.
  PlanContribution& ckpt = plan.contributions[0];
  ASSERT_GT(ckpt.time_factor, 1.0);
  ckpt.time_from_plan = false;
  const StepCost unseen = predict_step_cost(s->parts(), plan, fixed_rates(), {});
  EXPECT_DOUBLE_EQ(unseen.other, ckpt.time_factor);
  EXPECT_DOUBLE_EQ(unseen.total(), priced.total() * ckpt.time_factor);
  // MeZO's two forwards do not show in a plan: its own factor is used.
  auto mezo = test::make_session(recipe(dir.str(), "", 8, "plugin = \"mezo\"\n"), dry);
  const MemoryPlan mezo_plan = plan_memory(mezo->parts());
  EXPECT_FALSE(mezo_plan.contributions.back().time_from_plan);
  EXPECT_DOUBLE_EQ(predict_step_cost(mezo->parts(), mezo_plan, fixed_rates(), {}).other, 2.0 / 3.0);
}

// What the cost model reads beside the plan (16-bit compute, prefetch,
// micro-batches, what ranks exchange) is what the plugins' estimates say
// (tf_memory_estimate, ABI 1.24): the host names none of them.
TEST(StepCost, ThePluginsSayWhatTheCostModelReadsBesideThePlan) {
  test::TempDir dir;
  auto options_of = [&](const std::string& strategies, const std::string& schedule = "",
                        int ranks = 0) {
    SessionOptions dry;
    dry.dry_run = true;
    dry.plan_world_size = ranks;
    auto s = test::make_session(recipe(dir.str(), strategies, 8, schedule), dry);
    return cost_options(plan_memory(s->parts()));
  };
  const CostOptions plain = options_of("");
  EXPECT_FALSE(plain.low_precision_compute);
  EXPECT_EQ(plain.prefetch, 0);
  EXPECT_EQ(plain.micro_batches, 1);
  EXPECT_EQ(plain.zero_stage, -1);
  EXPECT_TRUE(options_of("[[strategy]]\nplugin = \"precision\"\n").low_precision_compute);
  EXPECT_FALSE(
      options_of("[[strategy]]\nplugin = \"precision\"\nmode = \"bf16\"\n").low_precision_compute);
  EXPECT_EQ(options_of("[[strategy]]\nplugin = \"lora\"\nrank = 8\n[[strategy]]\nplugin = "
                       "\"offload\"\nparams = \"disk\"\nprefetch = 2\n")
                .prefetch,
            2);
  EXPECT_EQ(options_of("", "plugin = \"accumulate\"\nmicro_batches = 4\nwarmup_steps = 1\n")
                .micro_batches,
            4);
  EXPECT_EQ(options_of("[[strategy]]\nplugin = \"shard\"\nmode = \"data\"\n", "", 2).zero_stage, 0);
  EXPECT_EQ(options_of("[[strategy]]\nplugin = \"shard\"\nmode = \"zero\"\nstage = 2\n", "", 2)
                .zero_stage,
            2);
}

TEST(Recipe, StrategiesAreReplacedAndWrittenBack) {
  test::TempDir dir;
  Recipe r = Recipe::parse(recipe(dir.str(),
                                  "[[strategy]]\nplugin = \"checkpoint\"\n[[strategy]]\n"
                                  "plugin = \"lora\"\nrank = 4\ntargets = [\"c_attn\"]\n"),
                           "r.toml");
  ASSERT_NE(r.strategy_table("lora"), nullptr);
  toml::table keys = *r.strategy_table("lora");
  keys.insert_or_assign("rank", int64_t{16});
  r.remove_strategies({"lora", "checkpoint"});
  EXPECT_EQ(r.strategy_table("checkpoint"), nullptr);
  r.add_strategy("lora", keys);
  const Recipe back = Recipe::parse(r.to_toml(), "back.toml");
  const toml::table* lora = back.strategy_table("lora");
  ASSERT_NE(lora, nullptr);
  EXPECT_EQ((*lora)["rank"].value_or(int64_t{0}), 16);
  EXPECT_EQ((*lora)["targets"][0].value_or(std::string()), "c_attn");
  EXPECT_EQ(back.array_tables("strategy").size(), 1u);
}

// The planned peak (bytes) of a recipe file, from `plan --json`.
int64_t planned_peak(const std::string& path) {
  std::string json;
  EXPECT_EQ(test::run_tightfit("plan " + path + " --json 2>/dev/null", &json), 0) << json;
  const size_t at = json.find("\"tracked_peak\": ");
  EXPECT_NE(at, std::string::npos) << json;
  return std::stoll(json.substr(at + 16));
}

// Each test keeps its measured rates in its own folder.
void private_rates_cache(const test::TempDir& dir) {
  ::setenv("TIGHTFIT_CACHE_DIR", dir.str().c_str(), 1);
}

TEST(Fit, KeepsTheMeasuredRatesForTheNextFit) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), ""));
  const std::string fit =
      "fit " + path + " --budget 1GiB --out " + (dir.path() / "f.toml").string();
  std::string log;
  ASSERT_EQ(test::run_tightfit(fit, &log), 0) << log;
  EXPECT_NE(log.find("measured now, kept in " + (dir.path() / "rates.json").string()),
            std::string::npos)
      << log;
  ASSERT_EQ(test::run_tightfit(fit, &log), 0) << log;
  EXPECT_NE(log.find("; --measure to redo"), std::string::npos) << log;
  EXPECT_EQ(log.find("measuring this machine"), std::string::npos) << log;
  write_file_synced((dir.path() / "rates.json").string(), "{ not json");  // damaged: measured again
  ASSERT_EQ(test::run_tightfit(fit, &log), 0) << log;
  EXPECT_NE(log.find("measured now"), std::string::npos) << log;
  ASSERT_EQ(test::run_tightfit(fit + " --measure", &log), 0) << log;
  EXPECT_NE(log.find("measuring this machine"), std::string::npos) << log;
}

TEST(Fit, WritesARecipeThatFitsTheBudget) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), ""));
  const int64_t plain = planned_peak(path);
  const int64_t budget = plain / 2;
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  ASSERT_EQ(test::run_tightfit(
                "fit " + path + " --budget " + std::to_string(budget) + " --out " + out, &log),
            0)
      << log;
  EXPECT_NE(log.find("(does not fit)"), std::string::npos) << log;  // the plain recipe
  // The plugins' refusals of stacks fit tried, each reason once with its count
  // (a full fine-tune's trained weights in a tier without their state there).
  EXPECT_NE(log.find(" refused: offload: trainable = true needs optimizer = "), std::string::npos)
      << log;
  EXPECT_NE(log.find("written       " + out), std::string::npos) << log;
  const int64_t fitted = planned_peak(out);
  EXPECT_LE(fitted, budget);
  EXPECT_GT(fitted, 0);
  // Said "tight" exactly when the plan + its margin passes the budget.
  const bool tight =
      static_cast<int64_t>(static_cast<double>(fitted) * (1 + MemoryPlan::kPlanMargin)) > budget;
  EXPECT_EQ(log.find("tight         its plan fits") != std::string::npos, tight) << log;
  // It still trains all weights: a full fine-tune fits half the plain peak.
  EXPECT_EQ(Recipe::load(out).strategy_table("lora"), nullptr) << read_file_text(out);
}

// A budget the plain recipe's plan fits only inside its margin of error: a
// run of it could stop out of budget, so a stack whose safe budget fits is
// written instead, though the plain one is faster.
TEST(Fit, PrefersAStackInsideItsMarginOverAFasterTightOne) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), ""));
  const int64_t plain = planned_peak(path);
  const int64_t budget = plain + plain / 20;  // the plain plan + 5%: fits, but tight
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  ASSERT_EQ(test::run_tightfit(
                "fit " + path + " --budget " + std::to_string(budget) + " --out " + out, &log),
            0)
      << log;
  EXPECT_NE(log.find("(fits)"), std::string::npos) << log;  // the plain recipe, by its plan
  EXPECT_EQ(log.find("written       " + out + " (plain)"), std::string::npos) << log;
  const int64_t fitted = planned_peak(out);
  EXPECT_LE(static_cast<int64_t>(static_cast<double>(fitted) * (1 + MemoryPlan::kPlanMargin)),
            budget);
  EXPECT_EQ(log.find("tight         its plan fits"), std::string::npos) << log;
}

TEST(Fit, QualityKeepsThePlainRecipeWhenItFits) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), ""));
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  ASSERT_EQ(
      test::run_tightfit("fit " + path + " --budget 64GiB --objective quality --out " + out, &log),
      0)
      << log;
  EXPECT_NE(log.find("written       " + out + " (plain)"), std::string::npos) << log;
  EXPECT_TRUE(Recipe::load(out).array_tables("strategy").empty());
}

TEST(Fit, TrainsAdaptersOnlyWhenNoFullFineTuneFits) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), ""));
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  // Below what any full fine-tune plans (the weights alone are 3.5 MiB of
  // embedding and 12 MiB of blocks, bf16 halves them).
  ASSERT_EQ(test::run_tightfit("fit " + path + " --budget 6MiB --out " + out, &log), 0) << log;
  EXPECT_NE(log.find("LoRA adapters train instead"), std::string::npos) << log;
  EXPECT_NE(Recipe::load(out).strategy_table("lora"), nullptr);
  EXPECT_LE(planned_peak(out), 6 << 20);
  EXPECT_EQ(test::run_tightfit("fit " + path + " --budget 6MiB --without lora --out " + out, &log),
            3)
      << log;
  EXPECT_NE(log.find("no stack of the installed strategies fits 6.0MiB; the smallest is"),
            std::string::npos)
      << log;
}

// The recipe's choices stay: a QLoRA recipe (LoRA r16 on an nf4 base) comes
// back with rank 16 and nf4 whatever the budget (r64 and a bf16 base were
// tried before), other ranks and formats only when asked for; each change to
// the recipe is printed with why.
TEST(Fit, KeepsTheRecipesRankAndFormatAndSaysWhatItChanged) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string qlora =
      "[[strategy]]\nplugin = \"quantize\"\nformat = \"nf4\"\n"
      "[[strategy]]\nplugin = \"lora\"\nrank = 16\nalpha = 32.0\n";
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), qlora));
  const int64_t plain = planned_peak(path);
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  ASSERT_EQ(
      test::run_tightfit(
          "fit " + path + " --budget " + std::to_string(plain * 3 / 4) + " --out " + out, &log),
      0)
      << log;
  const Recipe fitted = Recipe::load(out);
  ASSERT_NE(fitted.strategy_table("lora"), nullptr) << read_file_text(out);
  EXPECT_EQ((*fitted.strategy_table("lora"))["rank"].value_or(int64_t{0}), 16) << log;
  ASSERT_NE(fitted.strategy_table("quantize"), nullptr) << read_file_text(out);
  EXPECT_EQ((*fitted.strategy_table("quantize"))["format"].value_or(std::string()), "nf4") << log;
  EXPECT_NE(log.find("note          lora rank = 16 as the recipe sets it (--lora-ranks"),
            std::string::npos)
      << log;
  EXPECT_NE(
      log.find("note          quantize format = nf4 as the recipe sets it (--change quantize"),
      std::string::npos)
      << log;
  const size_t changes = log.find("changes       ");
  ASSERT_NE(changes, std::string::npos) << log;
  // Each change with why (here the batch split into micro-batches, or a strategy added).
  const std::string listed = log.substr(changes, log.find("\n\n", changes) - changes);
  EXPECT_TRUE(listed.find(": to fit ") != std::string::npos ||
              listed.find(": the same batch in micro-batches") != std::string::npos)
      << listed;
  // Asked for, other ranks are searched; an unknown --change is refused.
  ASSERT_EQ(test::run_tightfit("fit " + path + " --budget 1GiB --lora-ranks 4 --out " + out, &log),
            0)
      << log;
  EXPECT_EQ(log.find("lora rank = 16 as the recipe sets it"), std::string::npos) << log;
  EXPECT_EQ(test::run_tightfit("fit " + path + " --budget 1GiB --change rank --out " + out, &log),
            2)
      << log;
}

// A full fine-tune whose weights, gradients and state do not fit keeps its
// trained weights on disk with their optimizer state (offload trainable).
// (Updating in backward instead, fused_update with the state on disk, fits
// too and is left out here.)
TEST(Fit, PutsTrainedWeightsOnDiskWithTheirState) {
  test::TempDir dir;
  private_rates_cache(dir);
  // One short sequence: the weights (12.4 MiB), their gradients and state
  // are nearly all of the 50.7 MiB.
  std::string text = recipe(dir.str(), "", 1);
  text.replace(text.find("seq_len = 128"), 13, "seq_len = 16");
  const std::string path = test::write_file(dir, "r.toml", text);
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  ASSERT_EQ(
      test::run_tightfit(
          "fit " + path + " --budget 20MiB --without lora,precision,fused_update --out " + out,
          &log),
      0)
      << log;
  const Recipe fitted = Recipe::load(out);
  const toml::table* offload = fitted.strategy_table("offload");
  ASSERT_NE(offload, nullptr) << read_file_text(out);
  EXPECT_EQ((*offload)["params"].value_or(std::string()), "disk");
  EXPECT_EQ((*offload)["optimizer"].value_or(std::string()), "disk");
  EXPECT_TRUE((*offload)["trainable"].value_or(false));
  EXPECT_LE(planned_peak(out), 20 << 20);
}

// A mixture of experts whose frozen experts are nearly all of its memory
// (16 experts a layer, each token routed to one): under a budget that no
// stack keeping them in memory meets, fit keeps them on disk (offload
// params), where they come in only as the batch routes to them; the plan of
// the recipe it writes fits and counts those reads.
TEST(Fit, StreamsTheExpertsOfAMixtureFromDiskWhenOnlyThatFits) {
  test::TempDir dir;
  private_rates_cache(dir);
  std::string text = test::tiny_recipe(test::write_corpus(dir), dir.str(), "",
                                       "[[strategy]]\nplugin = \"lora\"\nrank = 4\n"
                                       "targets = [\"q\", \"v\"]\n");
  const auto begin = text.find("[model]"), end = text.find("[data]");
  text.replace(begin, end - begin, "[model]\n" + test::many_experts_model(dir) + "\n");
  const std::string path = test::write_file(dir, "moe.toml", text);
  const std::string out = (dir.path() / "fit.toml").string();
  // The smallest stack without offload, from fit's own refusal.
  std::string log;
  ASSERT_EQ(
      test::run_tightfit("fit " + path + " --budget 1KiB --without offload --out " + out, &log), 3)
      << log;
  const size_t smallest = log.find("; the smallest is ");
  ASSERT_NE(smallest, std::string::npos) << log;
  const size_t at = log.find(" at ", smallest) + 4;
  const int64_t in_memory = parse_byte_size(log.substr(at, log.find(". ", at) - at));
  ASSERT_GT(in_memory, 0) << log;
  const int64_t budget = in_memory * 3 / 4;
  ASSERT_EQ(test::run_tightfit(
                "fit " + path + " --budget " + std::to_string(budget) + " --out " + out, &log),
            0)
      << log;
  const Recipe fitted = Recipe::load(out);
  const toml::table* offload = fitted.strategy_table("offload");
  ASSERT_NE(offload, nullptr) << read_file_text(out);
  const std::string tier = (*offload)["params"].value_or(std::string());
  EXPECT_TRUE(tier == "disk" || tier == "host") << read_file_text(out);
  EXPECT_LE(planned_peak(out), budget);
  std::string json;
  ASSERT_EQ(test::run_tightfit("plan " + out + " --json 2>/dev/null", &json), 0) << json;
  const nlohmann::json plan = nlohmann::json::parse(json);
  EXPECT_EQ(plan["routed_reads"]["weights"].get<int64_t>(), 3 * 16 * 3) << json;
  EXPECT_GT(plan["routed_reads"]["reads_per_pass"].get<double>(), 0) << json;
}

// Checkpointed blocks' inputs on disk are a knob: a budget that only the
// stacks moving them there meet gets a recipe that does, and its plan fits.
TEST(Fit, MovesCheckpointedInputsToDiskWhenOnlyThatFits) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string lora = "[[strategy]]\nplugin = \"lora\"\nrank = 8\n";
  const std::string most = lora +
                           "[[strategy]]\nplugin = \"checkpoint\"\n[[strategy]]\n"
                           "plugin = \"offload\"\nparams = \"disk\"\noptimizer = \"disk\"\n"
                           "prefetch = 1\n";
  const int64_t with_inputs = planned_peak(
      test::write_file(dir, "a.toml", recipe(dir.str(), most + "activations = \"disk\"\n")));
  const int64_t without = planned_peak(test::write_file(dir, "b.toml", recipe(dir.str(), most)));
  ASSERT_LT(with_inputs, without);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), lora));
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  ASSERT_EQ(test::run_tightfit("fit " + path +
                                   " --keep lora --without quantize,precision,fused_update,"
                                   "accumulate --budget " +
                                   std::to_string((with_inputs + without) / 2) + " --out " + out,
                               &log),
            0)
      << log;
  const Recipe fitted = Recipe::load(out);
  const toml::table* offload = fitted.strategy_table("offload");
  ASSERT_NE(offload, nullptr) << read_file_text(out);
  EXPECT_EQ((*offload)["activations"].value_or(std::string()), "disk") << read_file_text(out);
  EXPECT_NE(fitted.strategy_table("checkpoint"), nullptr);
  EXPECT_LE(planned_peak(out), (with_inputs + without) / 2);
}

// With ranks, ZeRO stages are a knob: a budget below what data parallel
// plans per rank is met by partitioning, and the plan per rank agrees.
TEST(Fit, PartitionsAcrossRanksWhenThereAreRanks) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), ""));
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  const int64_t plain = planned_peak(path);
  const int64_t budget = plain * 3 / 4;
  ASSERT_EQ(
      test::run_tightfit("fit " + path +
                             " --ranks 4 --objective quality --without "
                             "lora,quantize,precision,checkpoint,offload,fused_update,accumulate"
                             " --budget " +
                             std::to_string(budget) + " --out " + out,
                         &log),
      0)
      << log;
  const Recipe fitted = Recipe::load(out);
  const toml::table* shard = fitted.strategy_table("shard");
  ASSERT_NE(shard, nullptr) << read_file_text(out);
  EXPECT_EQ((*shard)["mode"].value_or(std::string()), "zero");
  std::string json;
  ASSERT_EQ(test::run_tightfit("plan " + out + " --ranks 4 --json 2>/dev/null", &json), 0);
  EXPECT_LE(std::stoll(json.substr(json.find("\"tracked_peak\": ") + 16)), budget) << json;
}

// The installed plugins' declarations make the space. A stack that does not
// fit rules out those saving no more on every knob, but bf16 compute can
// cost memory (weight casts: precision declares autocast so), so it rules
// out nothing in fp32; bf16 weights and the other knobs do.
TEST(FitSearch, Bf16ComputeThatDoesNotFitRulesOutNothingInFp32) {
  test::TempDir dir;
  const Recipe base = Recipe::parse(recipe(dir.str(), ""), "r.toml");
  const host::FitSpace space = host::fit_space(
      base, test::registry(), {},
      {"lora", "quantize", "adamw8", "offload", "fused_update", "accumulate"}, {}, {}, false, 0);
  const std::vector<host::FitChoice> choices = host::enumerate_choices(space);
  auto stack = [&](const std::string& described) {
    for (const host::FitChoice& c : choices)
      if (c.describe() == described) return c;
    ADD_FAILURE() << "no stack \"" << described << "\" among " << choices.size();
    return host::FitChoice{};
  };
  const host::FitChoice fp32 = stack("plain"), autocast = stack("autocast"),
                        bf16_weights = stack("bf16 weights"), checkpointed = stack("checkpoint 1");
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(choices.size(), 9u);  // precision out, autocast, bf16 x checkpoint out, 2, 1
  EXPECT_FALSE(fp32.saves_no_more_than(autocast));
  EXPECT_TRUE(fp32.saves_no_more_than(bf16_weights));
  EXPECT_TRUE(autocast.saves_no_more_than(bf16_weights));
  EXPECT_TRUE(fp32.saves_no_more_than(checkpointed));
  EXPECT_FALSE(checkpointed.saves_no_more_than(fp32));
  EXPECT_EQ(autocast.approximations(), std::vector<std::string>{"bf16 compute"});
  EXPECT_EQ(fp32.strategies(), 0);
  EXPECT_EQ(stack("bf16 weights + checkpoint 2").strategies(), 2);
}

// fit's documented tie-break: predicted times within 2% of the fastest are
// a tie the cost model cannot split, so the stack that changes the maths
// least wins it (an exact stack 0.4% slower than bf16 weights), then the
// one with fewer strategies, then the smaller; past 2% the faster wins. A
// stack that fits only by its plan comes after every one inside its margin.
TEST(FitRank, AnExactStackWithinTwoPercentBeatsAFasterLossyOne) {
  using host::FitChoice;
  using host::Planned;
  using host::rank_stacks;
  const Recipe recipe = Recipe::parse("[run]\nsteps = 1\n", "r.toml");
  // As fit describes and scores them: bf16 weights change the maths (1), a
  // checkpoint adds a strategy.
  auto stack = [&](const std::string& weights, const std::string& precision, int checkpoint,
                   double seconds, int64_t peak) {
    Planned p{FitChoice{}, recipe, MemoryPlan{}, StepCost{}};
    std::vector<std::string> parts;
    if (weights != "dense") parts.push_back(weights + " base");
    if (precision == "bf16") parts.push_back("bf16 weights");
    if (checkpoint > 0) parts.push_back("checkpoint " + std::to_string(checkpoint));
    for (const std::string& part : parts)
      p.choice.described = p.choice.described == "plain" ? part : p.choice.described + " + " + part;
    p.choice.penalty = (precision == "bf16" ? 1.0 : 0.0) + (weights == "nf4" ? 1.0 : 0.0);
    p.choice.added = static_cast<int>(parts.size());
    p.cost.matmul = seconds;
    p.plan.tracked_peak = peak;
    return p;
  };
  const int64_t budget = int64_t{1} << 30;
  std::vector<Planned> fitting{stack("dense", "bf16", 0, 1.000, 100 << 20),
                               stack("dense", "none", 1, 1.004, 120 << 20)};
  rank_stacks(fitting, budget, "speed");
  EXPECT_EQ(fitting[0].choice.describe(), stack("dense", "none", 1, 0, 0).choice.describe())
      << "the exact stack, 0.4% slower, wins the tie";
  // Past 2%, the faster stack wins whatever it changes.
  fitting = {stack("dense", "none", 1, 1.03, 120 << 20), stack("dense", "bf16", 0, 1.0, 100 << 20)};
  rank_stacks(fitting, budget, "speed");
  EXPECT_EQ(fitting[0].choice.describe(), "bf16 weights");
  // Two exact stacks in a tie: fewer strategies, then the smaller.
  fitting = {stack("dense", "none", 1, 1.0, 90 << 20), stack("dense", "none", 0, 1.01, 150 << 20)};
  rank_stacks(fitting, budget, "speed");
  EXPECT_EQ(fitting[0].choice.describe(), "plain");
  // Fitting only by its plan (no room for the plan's margin): last, however fast.
  fitting = {stack("dense", "none", 0, 0.5, budget - 1), stack("dense", "bf16", 0, 1.0, 100 << 20)};
  rank_stacks(fitting, budget, "speed");
  EXPECT_EQ(fitting[0].choice.describe(), "bf16 weights");
  EXPECT_EQ(fitting[1].plan.tracked_peak, budget - 1);
}

TEST(Fit, RefusesBadInput) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), ""));
  std::string log;
  EXPECT_EQ(test::run_tightfit("fit " + path, &log), 2) << log;
  EXPECT_NE(log.find("--budget is required"), std::string::npos) << log;
  EXPECT_EQ(test::run_tightfit("fit " + path + " --budget 1GiB --objective cheap", &log), 2);
  EXPECT_NE(log.find("--objective is speed or quality"), std::string::npos) << log;
  EXPECT_EQ(test::run_tightfit("fit " + path + " --budget 1MiB", &log), 3) << log;
  EXPECT_EQ(test::run_tightfit("fit " + path + " --budget 1GiB --keep nosuch", &log), 2) << log;
  EXPECT_NE(log.find("no plugin named \"nosuch\""), std::string::npos) << log;
}

TEST(Fit, NamesTheFixForAGpuRecipeOnAMachineWithoutOne) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has CUDA";
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), ""));
  std::string log;
  EXPECT_EQ(test::run_tightfit("fit " + path + " --set run.device=cuda:0 --budget 1GiB", &log), 1)
      << log;
  EXPECT_NE(log.find("no such CUDA device is available here"), std::string::npos) << log;
  EXPECT_NE(log.find("tightfit plan RECIPE --budget SIZE"), std::string::npos) << log;
  EXPECT_EQ(log.find("frame #"), std::string::npos) << log;  // no LibTorch backtrace
}

TEST(Fit, VerifyRunsTheTopStacksAndComparesThem) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", recipe(dir.str(), ""));
  const int64_t budget = planned_peak(path) * 3 / 5;
  std::string log;
  ASSERT_EQ(test::run_tightfit("fit " + path + " --budget " + std::to_string(budget) + " --out " +
                                   (dir.path() / "fit.toml").string() +
                                   // stacks whose plans test_planned_peak holds within 10%
                                   " --without precision,quantize" +
                                   " --verify --verify-top 2 --verify-steps 3",
                               &log),
            0)
      << log;
  EXPECT_EQ(log.find("the run failed"), std::string::npos) << log;
  EXPECT_NE(log.find("rank correlation of predicted and measured step time"), std::string::npos)
      << log;
  // Each verified row: planned, measured and their error within 15%.
  std::istringstream lines(log.substr(log.find("verify: ")));
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    const size_t pct = line.find('%');
    if (line.rfind("  1 ", 0) != 0 && line.rfind("  2 ", 0) != 0) continue;
    ++rows;
    const size_t start = line.rfind(' ', pct) + 1;
    EXPECT_LE(std::abs(std::strtod(line.substr(start, pct - start).c_str(), nullptr)), 15.0)
        << line;
  }
  EXPECT_EQ(rows, 2) << log;
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// `fit --longest-context`: the longest row (to 256 tokens) some stack fits,
// the feed-forward whole or in tiles where the model tiles (a llama whose
// feed-forward is 16 times its width: tiles reach furthest); the recipe
// written at that length plans within the budget, and 256 tokens more fit
// no stack, whole or in any tile size tried. A budget that fits no row, a
// model that cannot tile (gpt2: whole alone) and one whose positions stop
// the search are said so.
std::string llama_recipe(const std::string& out) {
  std::string r = recipe(out, "[[strategy]]\nplugin = \"lora\"\nrank = 4\n", 1);
  const auto begin = r.find("[model]"), end = r.find("[data]");
  r.replace(begin, end - begin,
            "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 64\n"
            "n_head = 4\nintermediate_size = 1024\nmax_positions = 65536\n");
  return r;
}

TEST(FitLongestContext, TheLongestRowAStackFitsWrittenAtThatLength) {
  test::TempDir dir;
  private_rates_cache(dir);
  const std::string path = test::write_file(dir, "r.toml", llama_recipe(dir.str()));
  const int64_t budget = 64 << 20;
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  ASSERT_EQ(test::run_tightfit("fit " + path + " --budget " + std::to_string(budget) +
                                   " --longest-context --out " + out,
                               &log),
            0)
      << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("longest       ([0-9]+) tokens a row"))) << log;
  const int64_t longest = std::stoll(m[1]);
  EXPECT_EQ(longest % 256, 0) << log;
  EXPECT_NE(log.find("the feed-forward tried whole, 4096, 1024"), std::string::npos) << log;
  const Recipe written = Recipe::load(out);
  EXPECT_EQ((*written.table("data"))["seq_len"].value_or(int64_t{0}), longest);
  const int64_t tile = (*written.table("run"))["mlp_tile_tokens"].value_or(int64_t{0});
  EXPECT_GT(tile, 0) << read_file_text(out);
  EXPECT_LE(planned_peak(out), budget);
  EXPECT_NE(log.find("~ data.seq_len = " + std::to_string(longest)), std::string::npos) << log;
  // 256 tokens more: no stack fits, whole or in either tile size.
  for (const char* tiles : {"0", "4096", "1024"}) {
    const std::string longer = "fit " + path + " --budget " + std::to_string(budget) +
                               " --set data.seq_len=" + std::to_string(longest + 256) +
                               " --set run.mlp_tile_tokens=" + tiles + " --out " + out;
    EXPECT_EQ(test::run_tightfit(longer, &log), 3) << tiles << "\n" << log;
  }
  // The model's positions stop a search that would go on.
  ASSERT_EQ(
      test::run_tightfit("fit " + path + " --budget 64GiB --longest-context --out " + out, &log), 0)
      << log;
  EXPECT_NE(log.find("longest       65536 tokens"), std::string::npos) << log;
  EXPECT_NE(log.find("refused       a longer row: "), std::string::npos) << log;
  // Not even 256 tokens: out of budget, said so.
  EXPECT_EQ(
      test::run_tightfit("fit " + path + " --budget 1MiB --longest-context --out " + out, &log), 3)
      << log;
  EXPECT_NE(log.find("fits a row of 256 tokens in 1.0MiB"), std::string::npos) << log;
}

TEST(FitLongestContext, AModelThatCannotTileTriesTheWholeFeedForward) {
  test::TempDir dir;
  private_rates_cache(dir);
  std::string r = recipe(dir.str(), "", 1);
  r.replace(r.find("n_positions = 128"), 17, "n_positions = 1024");
  const std::string path = test::write_file(dir, "r.toml", r);
  const std::string out = (dir.path() / "fit.toml").string();
  std::string log;
  ASSERT_EQ(
      test::run_tightfit("fit " + path + " --budget 1GiB --longest-context --out " + out, &log), 0)
      << log;
  EXPECT_NE(log.find("longest       1024 tokens a row"), std::string::npos) << log;
  EXPECT_NE(log.find("the feed-forward tried whole\n"), std::string::npos) << log;
  EXPECT_EQ(Recipe::load(out).table("run")->contains("mlp_tile_tokens"), false);
}

}  // namespace
}  // namespace tightfit
