// The cpo schedule against TRL 0.24's CPOTrainer (each row's log-probs, the
// loss, the metrics and every gradient, with LoRA and as a full fine-tune),
// and in recipes: refusals by name, training, resume, the plan.
#include "preference_test_support.hpp"

namespace tightfit {
namespace {

using namespace preference_test;

// The cpo schedule against TRL 0.24's CPOTrainer: no reference model, rows
// tokenized jointly; with a LoRA adapter (PEFT) and as a full fine-tune.
struct CpoCase {
  const char* name;
  const char* loss_type;
  double beta, label_smoothing, cpo_alpha, simpo_gamma;
  bool lora;
};

void PrintTo(const CpoCase& c, std::ostream* os) {
  *os << c.name;
}

class CpoParity : public ::testing::TestWithParam<CpoCase> {
 protected:
  static void SetUpTestSuite() { data_ = data_peer(); }
  static void TearDownTestSuite() { delete data_; }
  static test::TempDir* data_;
};
test::TempDir* CpoParity::data_ = nullptr;

std::string cpo_recipe(const std::string& dir, const CpoCase& c) {
  std::ostringstream os;
  os << "[run]\nname = \"cpo\"\nseed = 7\nsteps = 1\nout_dir = \"" << dir
     << "\"\nsample_tokens = 0\neval_batches = 0\nlog_every = 1000\n\n"
     << "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
     << "n_kv_head = 2\nintermediate_size = 64\nmax_positions = 128\n\n"
     << "[data]\ncorpus = \"" << dir << "/rows.jsonl\"\ntokenizer = \"" << dir
     << "/tokenizer\"\nseq_len = " << kSeqLen
     << "\nbatch_size = 9\nval_fraction = 0\nmax_prompt_length = 64\n\n"
     << "[optimizer]\nlr = 0.0\ngrad_clip = 0.0\nweight_decay = 0.0\n\n"
     << "[schedule]\nplugin = \"cpo\"\nwarmup_steps = 0\nloss_type = \"" << c.loss_type
     << "\"\nbeta = " << c.beta << "\nlabel_smoothing = " << c.label_smoothing
     << "\ncpo_alpha = " << c.cpo_alpha << "\n"
     << (std::string(c.loss_type) == "simpo"
             ? "simpo_gamma = " + std::to_string(c.simpo_gamma) + "\n"
             : std::string())
     << "\n";
  if (c.lora)
    os << "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8.0\n"
       << "targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n";
  return os.str();
}

TEST_P(CpoParity, LogpsLossMetricsAndGradientsEqualTrl) {
  const CpoCase& c = GetParam();
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  auto s = test::make_session(cpo_recipe(dir, c));
  if (c.lora) randomize_trainable(*s);
  s->export_hf(dir + "/base", /*merge=*/false);
  if (c.lora) s->export_adapter(dir + "/adapter");
  std::ofstream(dir + "/options.json") << nlohmann::json({{"loss_type", c.loss_type},
                                                          {"beta", c.beta},
                                                          {"label_smoothing", c.label_smoothing},
                                                          {"cpo_alpha", c.cpo_alpha},
                                                          {"simpo_gamma", c.simpo_gamma},
                                                          {"max_length", kSeqLen + 1},
                                                          {"max_prompt_length", 64}})
                                              .dump();
  const auto want = run_trl_peer("cpo_parity.py", dir);
  ASSERT_FALSE(want.empty());

  // Each row's log-probabilities as the loss uses them.
  auto tok = BpeTokenizer::load(dir + "/tokenizer");
  const ChatFormatter chat(*tok, TokenizerConfig::load(dir + "/tokenizer"), TrainOn::kCompletion);
  PreferenceOptions options;
  options.max_length = kSeqLen + 1;
  options.max_prompt_length = 64;
  options.joint = true;
  const PreferenceFormatter formatter(chat, options);
  const std::vector<Example> seq = load_preference_examples(dir + "/rows.jsonl", formatter);
  const auto [tokens, targets] = rows_batch(seq, tok->token_id("</s>"));
  const int64_t pairs = tokens.size(0) / 2;
  {
    at::NoGradGuard no_grad;
    const Executor::SequenceLogps r = s->executor().sequence_logps(tokens, targets, {}, {});
    const bool average = std::string(c.loss_type) == "simpo" || std::string(c.loss_type) == "ipo";
    const at::Tensor policy = average ? r.logps / r.counts.to(at::kFloat) : r.logps;
    expect_close(policy.narrow(0, 0, pairs), want.at("policy_chosen"), "policy chosen logps");
    expect_close(policy.narrow(0, pairs, pairs), want.at("policy_rejected"), "policy rejected");
  }

  // One step over all the pairs at lr 0: the loss, the metrics and the gradients.
  const int compared =
      expect_step_equals_peer(*s, want, "cpo",
                              {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                               "rewards/margins", "logps/chosen", "logps/rejected", "nll_loss"},
                              c.lora, dir);
  // A and B of 7 projections in 2 layers; or every weight of the model.
  if (c.lora)
    EXPECT_EQ(compared, 2 * 2 * 7);
  else
    EXPECT_EQ(compared, 2 * 9 + 3);
}

// A mixture of experts with the routers' load-balancing loss
// (output_router_logits): CPOTrainer adds aux_loss_coef * aux_loss of the
// concatenated forward; the loss and every weight's gradient equal its, for
// a whole model trained.
TEST_F(CpoParity, AMixtureOfExpertsAddsItsRoutersLossAsTrlDoes) {
  const CpoCase c{"sigmoid_moe", "sigmoid", 0.5, 0.0, 1.0, 0.5, false};
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  auto s = test::make_session(with_moe_model(dir, cpo_recipe(dir, c)));
  s->export_hf(dir + "/base", /*merge=*/false);
  std::ofstream(dir + "/options.json") << nlohmann::json({{"loss_type", c.loss_type},
                                                          {"beta", c.beta},
                                                          {"label_smoothing", c.label_smoothing},
                                                          {"cpo_alpha", c.cpo_alpha},
                                                          {"max_length", kSeqLen + 1},
                                                          {"max_prompt_length", 64}})
                                              .dump();
  const auto want = run_trl_peer("cpo_parity.py", dir);
  ASSERT_FALSE(want.empty());
  const int compared = expect_step_equals_peer(
      *s, want, "cpo", {"rewards/chosen", "rewards/rejected", "nll_loss"}, false, dir);
  EXPECT_EQ(compared, kMoeWeights);
}

INSTANTIATE_TEST_SUITE_P(
    LossTypes, CpoParity,
    ::testing::Values(CpoCase{"sigmoid", "sigmoid", 0.1, 0.0, 1.0, 0.5, true},
                      CpoCase{"simpo", "simpo", 2.0, 0.0, 0.0, 0.5, true},
                      CpoCase{"simpo_nll_smoothed", "simpo", 2.0, 0.1, 1.0, 1.0, true},
                      CpoCase{"hinge", "hinge", 0.5, 0.0, 1.0, 0.5, true},
                      CpoCase{"ipo", "ipo", 0.1, 0.0, 0.5, 0.5, true},
                      CpoCase{"sigmoid_full", "sigmoid", 0.1, 0.0, 1.0, 0.5, false},
                      CpoCase{"simpo_full", "simpo", 2.0, 0.0, 0.0, 0.5, false}),
    [](const auto& info) { return std::string(info.param.name); });

// The cpo schedule in recipes: what it cannot do is refused by name; it
// trains a whole model (no reference needed), evaluates, resumes exactly
// and is planned within the others' 10%.
class CpoRecipes : public PreferenceRecipes {
 protected:
  static constexpr const char* kCpo = "plugin = \"cpo\"\n";
  static constexpr const char* kPromptLimit = "max_prompt_length = 32\n";
};

TEST_F(CpoRecipes, RecipesThatCannotWorkAreRefusedByName) {
  test::TempDir d;
  const std::pair<std::string, std::string> bad[] = {
      {"", "max_prompt_length = 512 is not below max_length = 97 (seq_len + 1)"},
      {std::string(kPromptLimit) + "max_completion_length = 5\n",
       "leave max_completion_length out"},
  };
  for (const auto& [extra, message] : bad) {
    const std::string e =
        error_of([&] { test::make_session(recipe(d.str(), rows(), extra, kCpo, "")); });
    EXPECT_NE(e.find(message), std::string::npos) << extra << ": " << e;
  }
  // Checked before a row is read: `plan` (a dry run) refuses it too.
  const std::string planned =
      error_of([&] { test::plan_of(recipe(d.str(), rows(), "", kCpo, "")); });
  EXPECT_NE(planned.find("is not below max_length"), std::string::npos) << planned;
  const std::pair<std::string, std::string> bad_keys[] = {
      {"loss_type = \"sigmoid\"\nsimpo_gamma = 1.0\n", "simpo_gamma applies to loss_type"},
      {"loss_type = \"hinge\"\nlabel_smoothing = 0.1\n", "label_smoothing applies to loss_type"},
  };
  for (const auto& [keys, message] : bad_keys) {
    const std::string e = error_of([&] {
      test::make_session(recipe(d.str(), rows(), kPromptLimit, std::string(kCpo) + keys, ""));
    });
    EXPECT_NE(e.find(message), std::string::npos) << keys << ": " << e;
  }
}

// A schedule asking for a tokenization this host does not know is refused
// by name before a row is read (never read as DPO's rows).
TEST_F(CpoRecipes, AnUnknownPreferenceTokenizationIsRefusedByName) {
  test::TempDir d;
  std::string text =
      recipe(d.str(), rows(), "", "plugin = \"unknown_tokenization_schedule\"\n", "");
  text.replace(
      text.find("[run]\n"), 6,
      "[run]\nplugin_paths = [\"" + std::string(TIGHTFIT_FIXTURE_DIR) + "/tokenization\"]\n");
  const std::string e = error_of([&] { test::make_session(text); });
  EXPECT_NE(e.find("asks for preference_tokenization \"kto-v9\""), std::string::npos) << e;
}

TEST_F(CpoRecipes, TrainsAWholeModelEvaluatesAndResumesExactly) {
  test::TempDir d;
  auto run = [&](const std::string& out, bool resume, int64_t stop_after) {
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop_after;
    return test::make_session(recipe(out, rows(), kPromptLimit,
                                     std::string(kCpo) + "loss_type = \"simpo\"\n", "", 8),
                              o)
        ->train();
  };
  const TrainSummary full = run(d.str() + "/a", false, -1);
  ASSERT_EQ(full.losses.size(), 8u);
  EXPECT_LT(full.losses.back(), full.losses.front());
  EXPECT_TRUE(std::isfinite(full.val_loss));
  std::ifstream metrics(full.metrics_path);
  std::string line;
  std::getline(metrics, line);
  const auto first = nlohmann::json::parse(line);
  EXPECT_EQ(first["phase"], "cpo");
  EXPECT_TRUE(first.contains("cpo.rewards/margins")) << line;
  EXPECT_GT(first["cpo.nll_loss"].get<double>(), 0.0) << line;  // cpo_alpha = 1, TRL's default
  run(d.str() + "/b", false, 4);
  const TrainSummary second = run(d.str() + "/b", true, -1);
  ASSERT_EQ(second.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(second.losses[i], full.losses[4 + i]) << "step " << 4 + i;
}

// With LoRA, within the others' 10%. As a full fine-tune the plan models
// the plain pass's backward, where every gradient and most activations are
// alive at once; the weighted backward of sequence_logps peaked lower
// (+20% measured, 2026-11-28), so there it is an upper bound: never under.
TEST_F(CpoRecipes, PlannedPeakIsWithinTenPercentOfTheMeasuredPeak) {
  for (const bool lora : {true, false}) {
    test::TempDir d;
    const std::string text = recipe(
        d.str(), rows(), kPromptLimit, kCpo, lora ? kLora : "", 4,
        "n_layer = 4\nn_embd = 256\nn_head = 4\nn_kv_head = 2\nintermediate_size = 688\n", 61);
    const MemoryPlan plan = test::plan_of(text);
    EXPECT_TRUE(plan.unestimated.empty());
    const TrainSummary sum = test::make_session(text)->train();
    const int64_t measured = sum.memory.total_peak - sum.memory.peak[TF_MEM_OTHER];
    const double off = test::relative(plan.tracked_peak, measured);
    std::cout << "cpo" << (lora ? " + lora" : "") << ": planned " << format_bytes(plan.tracked_peak)
              << ", measured " << format_bytes(measured) << "\n";
    if (lora)
      EXPECT_LE(std::abs(off), 0.10);
    else
      EXPECT_TRUE(off >= 0 && off <= 0.25) << off;
  }
}

}  // namespace
}  // namespace tightfit
