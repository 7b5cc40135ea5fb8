// The grpo schedule against TRL 0.24's GRPOTrainer on the same weights,
// prompts and completions (the schedule's completions_file, the trainer's
// sampling replaced by the same ids; tests/peers/grpo_parity.py): the loss,
// the metrics TRL logs and every trained gradient, for each loss type, with
// a PEFT LoRA adapter and as a full fine-tune, with and without the KL term.
// Then what a recipe may and may not ask of it.
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "preference_test_support.hpp"
#include "run_rewards.hpp"
#include "run_summary.hpp"

namespace tightfit {
namespace {

using namespace preference_test;

struct GrpoCase {
  const char* name;
  bool lora;
  const char* loss_type;
  double beta, temperature;
  const char* level;
  const char* scale_rewards;
  bool mask_truncated;
  double epsilon_high;
  // Micro-batches of one prompt's group each (TRL's trainer.train() with
  // gradient_accumulation_steps, its steps_per_generation the same).
  int accumulation = 1;
  // A third reward, the scorer_model plugin's reward model (a seeded
  // LlamaForSequenceClassification, tests/peers/scorer_model.py); every
  // prompt then is a list of messages, as TRL renders a batch one way, and
  // the first ends with an assistant message the model continues.
  bool scorer = false;
  // TRL's steps_per_generation (0: the accumulation steps): micro-batches a
  // generation samples at once.
  int steps_per_generation = 0;
};

void PrintTo(const GrpoCase& c, std::ostream* os) {
  *os << c.name;
}

constexpr int64_t kGenerations = 4;
constexpr int64_t kMaxCompletion = 12;

class GrpoStepParity : public ::testing::TestWithParam<GrpoCase> {
 protected:
  static void SetUpTestSuite() { data_ = data_peer(); }
  static void TearDownTestSuite() { delete data_; }
  static test::TempDir* data_;
};
test::TempDir* GrpoStepParity::data_ = nullptr;

// Two prompt rows (text, and messages through the chat template), each with
// an answer, and their completions: some end with EOS, one is cut at
// max_completion_length; the rewards differ inside each group.
void write_prompts_and_completions(const std::string& dir, bool all_conversations = false) {
  std::ofstream(dir + "/prompts.jsonl")
      << (all_conversations
              // Ending with an assistant message: the model continues it, and
              // the rewards read its content before each completion (TRL's).
              ? R"({"prompt": [{"role": "user", "content": "Count to three:"}, )"
                R"({"role": "assistant", "content": "Sure:"}], "answer": "3"})"
              : R"({"prompt": "Count to three:", "answer": "3"})")
      << "\n"
      << R"({"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"})"
      << "\n";
  auto tok = BpeTokenizer::load(dir + "/tokenizer");
  const int64_t eos = tok->token_id("</s>");
  auto ended = [&](const std::string& text) {
    std::vector<int64_t> ids = tok->encode(text);
    ids.push_back(eos);
    return ids;
  };
  std::vector<int64_t> cut = tok->encode(" one, two, three, four, five, six, seven, eight");
  cut.resize(static_cast<size_t>(kMaxCompletion));
  const nlohmann::json rows[] = {
      {{"row", 0}, {"completion_ids", {ended(" 1 2 3"), ended(" three"), ended(" 3"), cut}}},
      {{"row", 1},
       {"completion_ids", {ended("4"), ended("The answer is 4"), ended("5"), ended("#### 4")}}}};
  std::ofstream out(dir + "/completions.jsonl");
  for (const auto& r : rows) out << r.dump() << "\n";
}

std::string grpo_recipe(const std::string& dir, const GrpoCase& c) {
  std::ostringstream os;
  os << "[run]\nname = \"grpo\"\nseed = 7\nsteps = 1\nout_dir = \"" << dir
     << "\"\nsample_tokens = 0\neval_batches = 0\nlog_every = 1000\n\n"
     << "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
     << "n_kv_head = 2\nintermediate_size = 64\nmax_positions = 128\n\n"
     << "[data]\ncorpus = \"" << dir << "/prompts.jsonl\"\ntokenizer = \"" << dir
     << "/tokenizer\"\nseq_len = " << kSeqLen << "\nbatch_size = " << 2 / c.accumulation
     << "\nval_fraction = 0\n\n"
     << "[optimizer]\nlr = 0.0\ngrad_clip = 0.0\n\n"
     << "[schedule]\nplugin = \"grpo\"\nwarmup_steps = 0\nnum_generations = " << kGenerations
     << "\nmax_completion_length = " << kMaxCompletion << "\nloss_type = \"" << c.loss_type
     << "\"\nbeta = " << c.beta << "\ntemperature = " << c.temperature
     << "\nimportance_sampling_level = \"" << c.level << "\"\nscale_rewards = \"" << c.scale_rewards
     << "\"\nmask_truncated_completions = " << (c.mask_truncated ? "true" : "false")
     << "\nepsilon_high = " << c.epsilon_high
     << "\ngradient_accumulation_steps = " << c.accumulation
     << "\nsteps_per_generation = " << c.steps_per_generation << "\ncompletions_file = \"" << dir
     << "/completions.jsonl\"\n\n"
     << "[[reward]]\nplugin = \"length\"\ntarget = 8\nweight = 0.5\n\n"
     << "[[reward]]\nplugin = \"exact_answer\"\n\n";
  if (c.scorer)
    os << "[[reward]]\nplugin = \"scorer_model\"\nname = \"scorer\"\nmodel = \"" << dir
       << "/scorer\"\nweight = 0.3\n\n";
  if (c.lora)
    os << "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8.0\n"
       << "targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n";
  return os.str();
}

// What tests/peers/grpo_parity.py reads: TRL's GRPOConfig for the case and
// the rewards (the recipe's [[reward]] tables).
void write_peer_options(const std::string& dir, const GrpoCase& c) {
  nlohmann::json rewards = {{{"plugin", "length"}, {"target", 8}, {"weight", 0.5}},
                            {{"plugin", "exact_answer"}}};
  if (c.scorer)
    rewards.push_back({{"plugin", "scorer_model"}, {"model", dir + "/scorer"}, {"weight", 0.3}});
  std::ofstream(dir + "/options.json")
      << nlohmann::json({
                            {"num_generations", kGenerations},
                            {"max_completion_length", kMaxCompletion},
                            {"temperature", c.temperature},
                            {"beta", c.beta},
                            {"loss_type", c.loss_type},
                            {"importance_sampling_level", c.level},
                            {"scale_rewards", c.scale_rewards},
                            {"mask_truncated_completions", c.mask_truncated},
                            {"epsilon", 0.2},
                            {"epsilon_high", c.epsilon_high},
                            {"gradient_accumulation_steps", c.accumulation},
                            {"steps_per_generation", c.steps_per_generation},
                            {"rewards", rewards},
                        })
             .dump();
}

TEST_P(GrpoStepParity, LossMetricsAndGradientsEqualTrl) {
  const GrpoCase& c = GetParam();
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  write_prompts_and_completions(dir, c.scorer);
  if (c.scorer) {
    ASSERT_NO_FATAL_FAILURE(make_scorer_peer(dir));
  }
  auto s = test::make_session(grpo_recipe(dir, c));
  if (c.lora) randomize_trainable(*s);
  s->export_hf(dir + "/base", /*merge=*/false);
  if (c.lora) s->export_adapter(dir + "/adapter");
  write_peer_options(dir, c);
  const auto want = run_trl_peer("grpo_parity.py", dir);
  ASSERT_FALSE(want.empty());
  // The groups' rewards differ: the advantages are not all zero.
  ASSERT_LT(want.at("metric.frac_reward_zero_std").item<double>(), 1.0);
  std::vector<const char*> metrics = {"reward",
                                      "reward_std",
                                      "frac_reward_zero_std",
                                      "rewards/length/mean",
                                      "rewards/length/std",
                                      "rewards/exact_answer/mean",
                                      "rewards/exact_answer/std",
                                      "completions/mean_length",
                                      "completions/min_length",
                                      "completions/max_length",
                                      "completions/clipped_ratio",
                                      "completions/mean_terminated_length",
                                      "completions/min_terminated_length",
                                      "completions/max_terminated_length",
                                      "num_tokens"};
  // Averaged over micro-batches: TRL shuffles a generation's rows before it
  // splits them into micro-batches (its generator's draw), tightfit splits
  // them by prompt, so with several these means are of other splits (the
  // gradient of grpo, dr_grpo and dapo is the same either way).
  if (c.scorer)
    for (const char* m : {"rewards/scorer/mean", "rewards/scorer/std"}) metrics.push_back(m);
  if (c.accumulation == 1) {
    for (const char* m :
         {"entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"})
      metrics.push_back(m);
    if (c.beta != 0) metrics.push_back("kl");
  }
  const int compared = expect_step_equals_peer(*s, want, "grpo", metrics, c.lora, dir);
  EXPECT_EQ(compared, c.lora ? 2 * 2 * 7 : 2 * 9 + 3);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GrpoStepParity,
    ::testing::Values(
        // TRL's defaults: DAPO, no reference (one pass).
        GrpoCase{"lora_dapo", true, "dapo", 0.0, 1.0, "token", "group", false, 0.2},
        // The KL term (the base with the adapters off), a temperature, the
        // batch's deviation, truncated completions masked.
        GrpoCase{"lora_grpo_kl", true, "grpo", 0.04, 0.7, "token", "batch", true, 0.2},
        // GSPO's sequence weights, Dr. GRPO's constant normalizer, no scaling.
        GrpoCase{"lora_dr_grpo_sequence", true, "dr_grpo", 0.0, 1.0, "sequence", "none", false,
                 0.28},
        // A full fine-tune against its starting weights (the kernel's copy).
        GrpoCase{"full_bnpo_kl", false, "bnpo", 0.04, 1.0, "token", "group", false, 0.2},
        // Two micro-batches of one prompt's group, one update (TRL's
        // trainer.train(): DAPO's tokens of the whole generation, GRPO's
        // mean over each micro-batch's completions divided by their count).
        GrpoCase{"lora_dapo_accumulated", true, "dapo", 0.0, 1.0, "token", "group", false, 0.2, 2},
        GrpoCase{"lora_grpo_kl_accumulated", true, "grpo", 0.04, 1.0, "token", "group", false, 0.2,
                 2},
        // A reward model's scores beside the two functions (TRL's
        // PreTrainedModel reward: its chat template over the messages and
        // the completion, the logit at the last token that is not padding).
        // A generation each micro-batch (steps_per_generation = 1 under 2
        // accumulation steps): DAPO's tokens are each generation's, and the
        // generation metrics the mean of the step's two.
        GrpoCase{"lora_dapo_generation_each_micro_batch", true, "dapo", 0.0, 1.0, "token", "group",
                 false, 0.2, 2, false, 1},
        GrpoCase{"lora_grpo_scorer", true, "grpo", 0.0, 1.0, "token", "group", false, 0.2, 1,
                 true}),
    [](const auto& info) { return std::string(info.param.name); });

// A resumed step: one step at lr 1e-2 moves the policy, the run stops and
// resumes (the schedule's state and a full fine-tune's reference copy in the
// checkpoint), and the resumed step's loss, metrics and every gradient equal
// GRPOTrainer's with the moved policy (its LoRA adapter, or the exported
// weights with the starting ones as the reference).
TEST_F(GrpoStepParity, AResumedStepEqualsTrl) {
  for (const GrpoCase& c :
       {GrpoCase{"lora_grpo_kl", true, "grpo", 0.04, 0.7, "token", "batch", true, 0.2},
        GrpoCase{"full_bnpo_kl", false, "bnpo", 0.04, 1.0, "token", "group", false, 0.2}}) {
    SCOPED_TRACE(c.name);
    test::TempDir d;
    const std::string dir = d.str();
    copy_peer_data(*data_, d);
    write_prompts_and_completions(dir);
    std::string text = grpo_recipe(dir, c);
    text.replace(text.find("steps = 1"), 9, "steps = 2");
    text.replace(text.find("lr = 0.0"), 8, "lr = 1e-2");
    {
      SessionOptions o;
      o.stop_after_steps = 1;
      auto s = test::make_session(text, o);
      if (c.lora) randomize_trainable(*s);
      s->export_hf(dir + "/base", /*merge=*/false);
      ASSERT_EQ(s->train().losses.size(), 1u);
      if (c.lora)
        s->export_adapter(dir + "/adapter");
      else
        s->export_hf(dir + "/policy", /*merge=*/false);
    }
    write_peer_options(dir, c);
    const auto want = run_trl_peer("grpo_parity.py", dir);
    ASSERT_FALSE(want.empty());
    // The policy moved away from its reference: the KL term is not zero.
    EXPECT_GT(want.at("metric.kl").item<double>(), 1e-6);
    SessionOptions o;
    o.resume = true;
    auto s = test::make_session(text, o);
    const int compared = expect_step_equals_peer(
        *s, want, "grpo", {"reward", "reward_std", "kl", "entropy", "clip_ratio/region_mean"},
        c.lora, dir);
    EXPECT_EQ(compared, c.lora ? 2 * 2 * 7 : 2 * 9 + 3);
  }
}

class GrpoRecipes : public GrpoStepParity {};

// `text` (its files in `dir`) run again in a fresh folder: stopped after
// its first step, then resumed to its end; the resumed session's summary.
TrainSummary resumed_after_one_step(const std::string& text, const std::string& dir,
                                    const test::TempDir& data) {
  test::TempDir d2;
  copy_peer_data(data, d2);
  write_prompts_and_completions(d2.str());
  std::string again = text;
  for (size_t at; (at = again.find(dir)) != std::string::npos;)
    again.replace(at, dir.size(), d2.str());
  {
    SessionOptions o;
    o.stop_after_steps = 1;
    EXPECT_EQ(test::make_session(again, o)->train().losses.size(), 1u);
  }
  SessionOptions o;
  o.resume = true;
  return test::make_session(again, o)->train();
}

std::string error_of_session(const std::string& recipe) {
  return error_of([&] { test::make_session(recipe)->train(); });
}

TEST_F(GrpoRecipes, WhatCannotWorkIsRefusedByName) {
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  write_prompts_and_completions(dir);
  const GrpoCase c{"x", true, "dapo", 0.0, 1.0, "token", "group", false, 0.2};
  const std::string good = grpo_recipe(dir, c);
  auto without = [&](const std::string& part) {
    std::string r = good;
    const auto at = r.find(part);
    EXPECT_NE(at, std::string::npos) << part;
    return r.erase(at, part.size());
  };
  // No reward: nothing to train on.
  std::string e =
      error_of_session(without("[[reward]]\nplugin = \"length\"\ntarget = 8\nweight = "
                               "0.5\n\n[[reward]]\nplugin = \"exact_answer\"\n\n"));
  EXPECT_NE(e.find("no [[reward]] table"), std::string::npos) << e;
  // Rewards for a schedule that samples nothing.
  std::string dpo = good;
  dpo.replace(dpo.find("plugin = \"grpo\""), 15, "plugin = \"dpo\"");
  dpo.replace(dpo.find("prompts.jsonl"), 13, "rows.jsonl");
  e = error_of([&] {
    test::make_session(dpo.substr(0, dpo.find("num_generations")) +
                       dpo.substr(dpo.find("[[reward]]")));
  });
  EXPECT_NE(e.find("[[reward]] scores completions"), std::string::npos) << e;
  // Prompt rows for a schedule that does not sample.
  e = error_of([&] {
    std::string sft = good.substr(0, good.find("[schedule]"));
    test::make_session(sft);
  });
  EXPECT_NE(e.find("prompts without answers"), std::string::npos) << e;
  // A reward weight that is not a number, two rewards under one name.
  std::string r = good;
  r.replace(r.find("weight = 0.5"), 12, "weight = nan");
  e = error_of([&] { test::make_session(r); });
  EXPECT_NE(e.find("weight must be a finite number"), std::string::npos) << e;
  r = good;
  r.replace(r.find("plugin = \"exact_answer\""), 23, "plugin = \"length\"");
  e = error_of([&] { test::make_session(r); });
  EXPECT_NE(e.find("a second reward named \"length\""), std::string::npos) << e;
  // A data row without the answer the reward reads: the run stops naming it.
  std::ofstream(dir + "/prompts.jsonl", std::ios::app) << R"({"prompt": "No answer here"})"
                                                       << "\n";
  std::ofstream(dir + "/completions.jsonl", std::ios::app)
      << R"({"row": 2, "completion_ids": [[5], [6], [7], [8]]})"
      << "\n";
  r = good;
  r.replace(r.find("batch_size = 2"), 14, "batch_size = 3");
  e = error_of_session(r);
  EXPECT_NE(e.find("has no \"answer\""), std::string::npos) << e;
}

// A reward that fails or returns what is not a score stops the run naming
// it and the row, before any update; a reward's NaN ("none for this row")
// is left out of the sum where another reward scores the row.
TEST_F(GrpoRecipes, ARewardThatFailsOrReturnsGarbageStopsTheRunBeforeAnUpdate) {
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  write_prompts_and_completions(dir);
  const GrpoCase c{"x", true, "dapo", 0.0, 1.0, "token", "group", false, 0.2};
  std::string base = grpo_recipe(dir, c);
  base.replace(
      base.find("[model]"), 7,
      "plugin_paths = [\"" + std::string(TIGHTFIT_FIXTURE_DIR) + "/hostile_reward\"]\n\n[model]");
  auto with = [&](const std::string& mode, bool alone) {
    std::string r = base;
    const std::string hostile =
        "[[reward]]\nplugin = \"hostile_reward\"\nmode = \"" + mode + "\"\n\n";
    const auto first = r.find("[[reward]]");
    if (alone) {
      r.erase(first, r.find("[[strategy]]") - first);
      r.insert(first, hostile);
    } else {
      r.insert(first, hostile);
    }
    return r;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"inf", "reward \"hostile_reward\" scored completion 1 of"},
      {"nan_all", "no reward scored completion 0 of"},
      {"error", "the grader's service is down"},
      {"throw", "threw an exception in score (hostile reward)"}};
  for (const auto& [mode, message] : cases) {
    std::string e = error_of_session(with(mode, true));
    EXPECT_NE(e.find(message), std::string::npos) << mode << ": " << e;
    EXPECT_FALSE(fs::exists(dir + "/grpo/checkpoints")) << mode;
  }
  // A reward that never returns stops the run at its time limit, naming it.
  {
    std::string hang = with("hang", true);
    hang.insert(hang.find("mode = \"hang\""), "time_limit = 0.5\n");
    const auto began = std::chrono::steady_clock::now();
    const std::string e = error_of_session(hang);
    EXPECT_NE(e.find("did not return from score within its time_limit of 0.5 s"), std::string::npos)
        << e;
    EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(60));
    EXPECT_FALSE(fs::exists(dir + "/grpo/checkpoints"));
    std::string bad = with("none", true);
    bad.insert(bad.find("mode = \"none\""), "time_limit = -1\n");
    EXPECT_NE(error_of_session(bad).find("time_limit must be a number of seconds > 0"),
              std::string::npos);
  }
  // With another reward beside it, a NaN is left out of that row's sum.
  const TrainSummary sum = test::make_session(with("nan_first", false))->train();
  ASSERT_EQ(sum.losses.size(), 1u);
  std::ifstream in(sum.metrics_path);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) last = line;
  const auto rec = nlohmann::json::parse(last);
  EXPECT_DOUBLE_EQ(rec["grpo.rewards/hostile_reward/mean"].get<double>(), 1.0);
  EXPECT_TRUE(std::isfinite(rec["grpo.reward"].get<double>()));
}

// steps_per_generation = 2 over single updates: a generation every other
// step, its second micro-batch trained after the update the first made (so
// with the sampling policy's log-probs kept for the ratio), and a run
// stopped between them resumes on the saved generation, ending where the
// uninterrupted run ends.
TEST_F(GrpoRecipes, AGenerationSpansTwoUpdatesAndSurvivesAResume) {
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  write_prompts_and_completions(dir);
  GrpoCase c{"x", true, "grpo", 0.0, 1.0, "token", "group", false, 0.2};
  c.steps_per_generation = 2;
  std::string text = grpo_recipe(dir, c);
  text.replace(text.find("steps = 1"), 9, "steps = 4");
  text.replace(text.find("lr = 0.0"), 8, "lr = 1e-2");
  text.replace(text.find("batch_size = 2"), 14, "batch_size = 1");
  const TrainSummary whole = test::make_session(text)->train();
  ASSERT_EQ(whole.losses.size(), 4u);
  std::ifstream in(whole.metrics_path);
  std::vector<nlohmann::json> steps;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) steps.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(steps.size(), 4u);
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(i);
    // Sampled (read) at steps 1 and 3 only; each step trains.
    EXPECT_EQ(steps[i].contains("grpo.completions/mean_length"), i % 2 == 0) << steps[i];
    EXPECT_TRUE(steps[i].contains("grpo.clip_ratio/region_mean")) << steps[i];
    EXPECT_TRUE(std::isfinite(whole.losses[i]));
  }
  // At an importance ratio of 1, a micro-batch of one group loses minus its
  // mean advantage, 0: so does the generation's first micro-batch. The
  // second trains one update after its sampling, against the log-probs kept
  // from then: its ratio is not 1, nor its loss 0.
  EXPECT_LT(std::abs(whole.losses[0]), 1e-6);
  EXPECT_GT(std::abs(whole.losses[1]), 1e-6);

  const TrainSummary resumed = resumed_after_one_step(text, dir, *data_);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(resumed.losses[i], whole.losses[i + 1]) << i;
}

// Sampling (no completions file): each step samples, scores and trains;
// what TRL logs is logged; a run stopped after its first step and resumed
// samples the same completions and ends where the uninterrupted run ends.
TEST_F(GrpoRecipes, SamplesScoresTrainsAndResumesExactly) {
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  write_prompts_and_completions(dir);
  const GrpoCase c{"x", true, "grpo", 0.04, 0.9, "token", "group", false, 0.2};
  std::string text = grpo_recipe(dir, c);
  text.erase(text.find("completions_file"),
             text.find("\n\n[[reward]]") - text.find("completions_file"));
  text.replace(text.find("steps = 1"), 9, "steps = 2");
  text.replace(text.find("lr = 0.0"), 8, "lr = 1e-2");
  text.replace(text.find("batch_size = 2"), 14, "batch_size = 1");
  const TrainSummary whole = test::make_session(text)->train();
  ASSERT_EQ(whole.losses.size(), 2u);
  std::ifstream in(whole.metrics_path);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) last = line;
  const auto rec = nlohmann::json::parse(last);
  for (const char* key : {"grpo.reward", "grpo.rewards/length/mean", "grpo.kl", "grpo.entropy",
                          "grpo.completions/mean_length"})
    EXPECT_TRUE(rec.contains(key)) << key << " not in " << last;
  EXPECT_LE(rec["grpo.completions/max_length"].get<double>(), kMaxCompletion);
  EXPECT_TRUE(std::isfinite(whole.losses[1]));
  // The summary's reward line: the first step's reward, then the last's.
  {
    std::ifstream first_in(whole.metrics_path);
    std::string first;
    std::getline(first_in, first);
    char want[128];
    std::snprintf(want, sizeof want, "%.3f over step 1 -> %.3f over step 2 (grpo.reward",
                  nlohmann::json::parse(first)["grpo.reward"].get<double>(),
                  rec["grpo.reward"].get<double>());
    const std::optional<std::string> line = host::reward_before_after(whole.metrics_path, "grpo");
    ASSERT_TRUE(line.has_value());
    EXPECT_EQ(line->rfind(want, 0), 0u) << *line << " vs " << want;
    EXPECT_FALSE(host::reward_before_after(whole.metrics_path, "dpo").has_value());
    // And `tightfit ab`'s reward curve: each step's mean reward.
    const nlohmann::json curve = host::summarize(whole.metrics_path)["curve"];
    ASSERT_EQ(curve["reward"].size(), 2u);
    EXPECT_EQ(curve["reward_step"][1].get<double>(), 2.0);
    EXPECT_EQ(curve["reward"][1].get<double>(), rec["grpo.reward"].get<double>());
  }

  const TrainSummary resumed = resumed_after_one_step(text, dir, *data_);
  ASSERT_FALSE(resumed.losses.empty());
  EXPECT_DOUBLE_EQ(resumed.losses.back(), whole.losses.back());
}

}  // namespace
}  // namespace tightfit
