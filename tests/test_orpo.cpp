// The orpo schedule against TRL 0.24's ORPOTrainer (each completion's
// average log-prob, the loss, the metrics and every gradient, with LoRA and
// as a full fine-tune); the token_logps service it stands on (ABI 1.12);
// and in recipes: training, resume, the plan.
#include "preference_test_support.hpp"

namespace tightfit {
namespace {

using namespace preference_test;

struct OrpoCase {
  const char* name;
  double beta;
  bool lora;
};

void PrintTo(const OrpoCase& c, std::ostream* os) {
  *os << c.name;
}

class OrpoParity : public ::testing::TestWithParam<OrpoCase> {
 protected:
  static void SetUpTestSuite() { data_ = data_peer(); }
  static void TearDownTestSuite() { delete data_; }
  static test::TempDir* data_;
};
test::TempDir* OrpoParity::data_ = nullptr;

std::string orpo_recipe(const std::string& dir, const OrpoCase& c) {
  std::ostringstream os;
  os << "[run]\nname = \"orpo\"\nseed = 7\nsteps = 1\nout_dir = \"" << dir
     << "\"\nsample_tokens = 0\neval_batches = 0\nlog_every = 1000\n\n"
     << "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
     << "n_kv_head = 2\nintermediate_size = 64\nmax_positions = 128\n\n"
     << "[data]\ncorpus = \"" << dir << "/rows.jsonl\"\ntokenizer = \"" << dir
     << "/tokenizer\"\nseq_len = " << kSeqLen
     << "\nbatch_size = 9\nval_fraction = 0\nmax_prompt_length = 64\n\n"
     << "[optimizer]\nlr = 0.0\ngrad_clip = 0.0\nweight_decay = 0.0\n\n"
     << "[schedule]\nplugin = \"orpo\"\nwarmup_steps = 0\nbeta = " << c.beta << "\n\n";
  if (c.lora)
    os << "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8.0\n"
       << "targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n";
  return os.str();
}

TEST_P(OrpoParity, LogpsLossMetricsAndGradientsEqualTrl) {
  const OrpoCase& c = GetParam();
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  auto s = test::make_session(orpo_recipe(dir, c));
  if (c.lora) randomize_trainable(*s);
  s->export_hf(dir + "/base", /*merge=*/false);
  if (c.lora) s->export_adapter(dir + "/adapter");
  std::ofstream(dir + "/options.json") << nlohmann::json({{"trainer", "orpo"},
                                                          {"beta", c.beta},
                                                          {"max_length", kSeqLen + 1},
                                                          {"max_prompt_length", 64}})
                                              .dump();
  const auto want = run_trl_peer("cpo_parity.py", dir);
  ASSERT_FALSE(want.empty());

  // Each completion's average log-probability, from the per-token service.
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
    const at::Tensor each = s->executor().token_logps(tokens, targets, {}, {}).logps;
    const at::Tensor counts = targets.ne(kIgnoreIndex).sum(1).to(at::kFloat);
    const at::Tensor average = each.sum(1) / counts;
    expect_close(average.narrow(0, 0, pairs), want.at("policy_chosen"), "policy chosen logps");
    expect_close(average.narrow(0, pairs, pairs), want.at("policy_rejected"), "policy rejected");
  }

  const int compared = expect_step_equals_peer(
      *s, want, "orpo",
      {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
       "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"},
      c.lora, dir);
  if (c.lora)
    EXPECT_EQ(compared, 2 * 2 * 7);
  else
    EXPECT_EQ(compared, 2 * 9 + 3);
}

// A mixture of experts with the routers' load-balancing loss
// (output_router_logits): ORPOTrainer adds aux_loss_coef * aux_loss of the
// concatenated forward; the loss and every weight's gradient equal its, for
// a whole model trained.
TEST_F(OrpoParity, AMixtureOfExpertsAddsItsRoutersLossAsTrlDoes) {
  const OrpoCase c{"moe", 0.1, false};
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  auto s = test::make_session(with_moe_model(dir, orpo_recipe(dir, c)));
  s->export_hf(dir + "/base", /*merge=*/false);
  std::ofstream(dir + "/options.json") << nlohmann::json({{"trainer", "orpo"},
                                                          {"beta", c.beta},
                                                          {"max_length", kSeqLen + 1},
                                                          {"max_prompt_length", 64}})
                                              .dump();
  const auto want = run_trl_peer("cpo_parity.py", dir);
  ASSERT_FALSE(want.empty());
  const int compared = expect_step_equals_peer(
      *s, want, "orpo", {"rewards/chosen", "rewards/rejected", "nll_loss", "log_odds_ratio"}, false,
      dir);
  EXPECT_EQ(compared, kMoeWeights);
}

INSTANTIATE_TEST_SUITE_P(Betas, OrpoParity,
                         ::testing::Values(OrpoCase{"lora", 0.1, true},
                                           OrpoCase{"lora_beta_1", 1.0, true},
                                           OrpoCase{"full", 0.1, false}),
                         [](const auto& info) { return std::string(info.param.name); });

// The service under it: token_logps's rows sum to sequence_logps's, its
// weighted backward is sequence_logps's when every token of a row weighs
// the same, and a target that is no token is refused before the pass.
class TokenLogps : public PreferenceRecipes {};

TEST_F(TokenLogps, SumsAndGradientsAreSequenceLogpsAndBadTargetsAreRefused) {
  test::TempDir d;
  auto s = test::make_session(
      recipe(d.str(), rows(), "max_prompt_length = 32\n", "plugin = \"orpo\"\n", kLora));
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(0, 200, {4, 24}, at::kLong);
  at::Tensor targets = at::randint(0, 200, {4, 24}, at::kLong);
  targets.narrow(1, 0, 6).fill_(kIgnoreIndex);
  const at::Tensor w = at::randn({4});
  auto grads = [&] {
    std::vector<at::Tensor> g;
    for (Param* p : s->store().trainable()) {
      g.push_back(p->value.grad().detach().clone());
      p->value.mutable_grad().zero_();
    }
    return g;
  };
  const Executor::SequenceLogps rows_sum = s->executor().sequence_logps(tokens, targets, {}, w);
  const std::vector<at::Tensor> by_row = grads();
  const Executor::TokenLogps each =
      s->executor().token_logps(tokens, targets, {}, w.unsqueeze(1).expand({4, 24}).contiguous());
  const std::vector<at::Tensor> by_token = grads();
  EXPECT_TRUE(at::equal(each.logps.sum(1), rows_sum.logps));
  EXPECT_TRUE(at::equal(each.logps.narrow(1, 0, 6), at::zeros({4, 6})));
  ASSERT_EQ(by_row.size(), by_token.size());
  for (size_t i = 0; i < by_row.size(); ++i) EXPECT_TRUE(at::equal(by_row[i], by_token[i])) << i;

  for (const int64_t bad : {int64_t{-7}, int64_t{1} << 40}) {
    at::Tensor wrong = targets.clone();
    wrong[1][9] = bad;
    const std::string e = error_of([&] { s->executor().token_logps(tokens, wrong, {}, {}); });
    EXPECT_NE(e.find("a target id " + std::to_string(bad) + " is neither ignore_index"),
              std::string::npos)
        << e;
  }
}

class OrpoRecipes : public PreferenceRecipes {
 protected:
  static constexpr const char* kOrpo = "plugin = \"orpo\"\n";
  static constexpr const char* kPromptLimit = "max_prompt_length = 32\n";
};

TEST_F(OrpoRecipes, TrainsAWholeModelEvaluatesAndResumesExactly) {
  test::TempDir d;
  auto run = [&](const std::string& out, bool resume, int64_t stop_after) {
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop_after;
    return test::make_session(recipe(out, rows(), kPromptLimit, kOrpo, "", 8), o)->train();
  };
  const TrainSummary full = run(d.str() + "/a", false, -1);
  ASSERT_EQ(full.losses.size(), 8u);
  EXPECT_LT(full.losses.back(), full.losses.front());
  EXPECT_TRUE(std::isfinite(full.val_loss));
  std::ifstream metrics(full.metrics_path);
  std::string line;
  std::getline(metrics, line);
  const auto first = nlohmann::json::parse(line);
  EXPECT_EQ(first["phase"], "orpo");
  EXPECT_GT(first["orpo.nll_loss"].get<double>(), 0.0) << line;
  EXPECT_LT(first["orpo.log_odds_ratio"].get<double>(), 0.0) << line;  // a log-sigmoid
  run(d.str() + "/b", false, 4);
  const TrainSummary second = run(d.str() + "/b", true, -1);
  ASSERT_EQ(second.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(second.losses[i], full.losses[4 + i]) << "step " << 4 + i;
}

// ORPOConfig's max_prompt_length must be below max_length, as CPOConfig's:
// refused with the fix, in a dry run too.
TEST_F(OrpoRecipes, APromptLimitNotBelowMaxLengthIsRefused) {
  test::TempDir d;
  const std::string e = error_of([&] { test::plan_of(recipe(d.str(), rows(), "", kOrpo, "")); });
  EXPECT_NE(e.find("max_prompt_length = 512 is not below max_length = 97"), std::string::npos) << e;
}

TEST_F(OrpoRecipes, PlannedPeakWithLoraIsWithinTenPercentOfTheMeasuredPeak) {
  test::TempDir d;
  const std::string text =
      recipe(d.str(), rows(), kPromptLimit, kOrpo, kLora, 4,
             "n_layer = 4\nn_embd = 256\nn_head = 4\nn_kv_head = 2\nintermediate_size = 688\n", 61);
  const MemoryPlan plan = test::plan_of(text);
  EXPECT_TRUE(plan.unestimated.empty());
  const TrainSummary sum = test::make_session(text)->train();
  const int64_t measured = sum.memory.total_peak - sum.memory.peak[TF_MEM_OTHER];
  std::cout << "orpo + lora: planned " << format_bytes(plan.tracked_peak) << ", measured "
            << format_bytes(measured) << "\n";
  EXPECT_LE(std::abs(test::relative(plan.tracked_peak, measured)), 0.10);
}

}  // namespace
}  // namespace tightfit
