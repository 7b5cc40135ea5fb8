// The dpo schedule against TRL 0.24's DPOTrainer with a PEFT LoRA adapter on
// the same weights, rows and batch (fp32): each row's policy and reference
// log-probabilities, the loss, the metrics TRL logs and every adapter
// gradient, for each loss type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "bpe_tokenizer.hpp"
#include "file_util.hpp"
#include "ignore_index.hpp"
#include "plan_recipes.hpp"
#include "plugin_hooks.hpp"
#include "preference_data.hpp"
#include "safetensors.hpp"
#include "strategy_chain.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  const char* loss_type;
  double beta, label_smoothing;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

constexpr int64_t kSeqLen = 96;

// The data test's peer (tests/peers/dpo_data.py): a tokenizer with a chat
// template and preference rows of every form, in a new folder.
test::TempDir* data_peer() {
  auto* dir = new test::TempDir();
  const std::string cmd = std::string(TIGHTFIT_SOURCE_DIR) + "/.venv/bin/python " +
                          TIGHTFIT_SOURCE_DIR + "/tests/peers/dpo_data.py " + dir->str() + " > " +
                          dir->str() + "/peer.log 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "the TRL peer failed; scripts/setup installs trl";
  return dir;
}

class DpoParity : public ::testing::TestWithParam<Case> {
 protected:
  // The tokenizer and the preference rows of the data test's peer.
  static void SetUpTestSuite() { data_ = data_peer(); }
  static void TearDownTestSuite() { delete data_; }
  static test::TempDir* data_;
};
test::TempDir* DpoParity::data_ = nullptr;

std::string recipe(const std::string& dir, const Case& c) {
  std::ostringstream os;
  os << "[run]\nname = \"dpo\"\nseed = 7\nsteps = 1\nout_dir = \"" << dir
     << "\"\nsample_tokens = 0\neval_batches = 0\nlog_every = 1000\n\n"
     << "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
     << "n_kv_head = 2\nintermediate_size = 64\nmax_positions = 128\n\n"
     << "[data]\ncorpus = \"" << dir << "/rows.jsonl\"\ntokenizer = \"" << dir
     << "/tokenizer\"\nseq_len = " << kSeqLen << "\nbatch_size = 9\nval_fraction = 0\n\n"
     << "[optimizer]\nlr = 0.0\ngrad_clip = 0.0\n\n"
     << "[schedule]\nplugin = \"dpo\"\nwarmup_steps = 0\nloss_type = \"" << c.loss_type
     << "\"\nbeta = " << c.beta << "\nlabel_smoothing = " << c.label_smoothing << "\n\n"
     << "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8.0\n"
     << "targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n";
  return os.str();
}

// The rows as the batcher lays out pairs: every chosen row, then every rejected one.
std::pair<at::Tensor, at::Tensor> rows_batch(const std::vector<Example>& seq, int64_t pad) {
  const auto n = static_cast<int64_t>(seq.size());
  at::Tensor tokens = at::full({n, kSeqLen}, pad, at::kLong);
  at::Tensor targets = at::full({n, kSeqLen}, kIgnoreIndex, at::kLong);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t row = k % 2 == 0 ? k / 2 : n / 2 + k / 2;
    const Example& e = seq[static_cast<size_t>(k)];
    for (size_t t = 0; t + 1 < e.ids.size(); ++t) {
      tokens[row][static_cast<int64_t>(t)] = e.ids[t];
      if (e.trained[t + 1]) targets[row][static_cast<int64_t>(t)] = e.ids[t + 1];
    }
  }
  return {tokens, targets};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = std::max(1e-3, want.abs().max().item<double>());
  const double diff = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
  EXPECT_LE(diff, 1e-4 * scale) << what << ": max |diff| " << diff << " at scale " << scale;
}

void set_adapters(Session& s, bool on) {
  StrategyChain(s.plugins().strategies).each(TF_STRATEGY_HOOK(set_adapters_enabled), on ? 1 : 0);
  s.executor().set_adapters_enabled(on);
}

TEST_P(DpoParity, LogpsLossMetricsAndGradientsEqualTrl) {
  const Case& c = GetParam();
  test::TempDir d;
  const std::string dir = d.str();
  fs::create_directories(dir + "/tokenizer");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(data_->path() / f, d.path() / "tokenizer" / f);
  fs::copy_file(data_->path() / "rows.jsonl", d.path() / "rows.jsonl");
  auto s = test::make_session(recipe(dir, c));
  {
    // Adapters away from their start (B = 0 would make policy = reference).
    at::NoGradGuard no_grad;
    at::manual_seed(11);
    for (Param* p : s->store().trainable()) p->value.copy_(at::randn_like(p->value) * 0.2);
  }
  s->export_hf(dir + "/base", /*merge=*/false);
  s->export_adapter(dir + "/adapter");
  std::ofstream(dir + "/options.json") << nlohmann::json({{"loss_type", c.loss_type},
                                                          {"beta", c.beta},
                                                          {"label_smoothing", c.label_smoothing},
                                                          {"max_length", kSeqLen + 1}})
                                              .dump();
  const std::string cmd = std::string(TIGHTFIT_SOURCE_DIR) + "/.venv/bin/python " +
                          TIGHTFIT_SOURCE_DIR + "/tests/peers/dpo_parity.py " + dir + " > " + dir +
                          "/peer.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file_text(dir + "/peer.log");
  const auto want = read_safetensors(dir + "/expected.safetensors").tensors;

  // Each row's log-probabilities, policy and reference (adapters off).
  auto tok = BpeTokenizer::load(dir + "/tokenizer");
  const ChatFormatter chat(*tok, TokenizerConfig::load(dir + "/tokenizer"), TrainOn::kCompletion);
  PreferenceOptions options;
  options.max_length = kSeqLen + 1;
  const PreferenceFormatter formatter(chat, options);
  const std::vector<Example> seq = load_preference_examples(dir + "/rows.jsonl", formatter);
  const auto [tokens, targets] = rows_batch(seq, tok->token_id("</s>"));
  const int64_t pairs = tokens.size(0) / 2;
  // IPO's log-probabilities are averages over each completion's tokens.
  const bool average = std::string(c.loss_type) == "ipo";
  auto logps_of = [&] {
    const Executor::SequenceLogps r = s->executor().sequence_logps(tokens, targets, {}, {});
    return average ? r.logps / r.counts.to(at::kFloat) : r.logps;
  };
  {
    at::NoGradGuard no_grad;
    const at::Tensor policy = logps_of();
    expect_close(policy.narrow(0, 0, pairs), want.at("policy_chosen"), "policy chosen logps");
    expect_close(policy.narrow(0, pairs, pairs), want.at("policy_rejected"), "policy rejected");
    set_adapters(*s, false);
    const at::Tensor ref = logps_of();
    set_adapters(*s, true);
    expect_close(ref.narrow(0, 0, pairs), want.at("ref_chosen"), "reference chosen logps");
    expect_close(ref.narrow(0, pairs, pairs), want.at("ref_rejected"), "reference rejected");
  }

  // One step over all the pairs at lr 0: the loss, the metrics and the gradients.
  const TrainSummary sum = s->train();
  ASSERT_EQ(sum.losses.size(), 1u);
  EXPECT_NEAR(sum.losses[0], want.at("loss").item<double>(),
              1e-4 * std::max(1.0, std::abs(want.at("loss").item<double>())));
  std::ifstream metrics(sum.metrics_path);
  std::string line;
  std::getline(metrics, line);
  const auto rec = nlohmann::json::parse(line);
  for (const char* m : {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                        "rewards/margins", "logps/chosen", "logps/rejected"}) {
    // A plugin's metrics carry its name: "dpo.rewards/chosen".
    const std::string key = std::string("dpo.") + m;
    ASSERT_TRUE(rec.contains(key)) << line;
    const double w = want.at(std::string("metric.") + m).item<double>();
    EXPECT_NEAR(rec[key].get<double>(), w, 1e-4 * std::max(1.0, std::abs(w))) << m;
  }
  {
    // The gradients, written under PEFT's names by the adapter writer.
    at::NoGradGuard no_grad;
    for (Param* p : s->store().trainable()) {
      ASSERT_TRUE(p->value.grad().defined()) << p->name;
      p->value.copy_(p->value.grad());
    }
  }
  const auto grads =
      read_safetensors(s->export_adapter(dir + "/grads") + "/adapter_model.safetensors").tensors;
  int compared = 0;
  for (const auto& [name, g] : grads) {
    ASSERT_TRUE(want.count("grad." + name)) << name;
    expect_close(g, want.at("grad." + name), "gradient of " + name);
    ++compared;
  }
  EXPECT_EQ(compared, 2 * 2 * 7);  // A and B of 7 projections in 2 layers
}

INSTANTIATE_TEST_SUITE_P(LossTypes, DpoParity,
                         ::testing::Values(Case{"sigmoid", "sigmoid", 0.1, 0.0},
                                           Case{"sigmoid_smoothed", "sigmoid", 0.5, 0.2},
                                           Case{"ipo", "ipo", 0.1, 0.0},
                                           Case{"hinge", "hinge", 0.5, 0.0}),
                         [](const auto& info) { return std::string(info.param.name); });

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
  fs::create_directories(dir + "/tokenizer");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(data_->path() / f, d.path() / "tokenizer" / f);
  fs::copy_file(data_->path() / "rows.jsonl", d.path() / "rows.jsonl");
  auto s = test::make_session(cpo_recipe(dir, c));
  if (c.lora) {
    at::NoGradGuard no_grad;  // adapters away from their start (B = 0)
    at::manual_seed(11);
    for (Param* p : s->store().trainable()) p->value.copy_(at::randn_like(p->value) * 0.2);
  }
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
  const std::string cmd = std::string(TIGHTFIT_SOURCE_DIR) + "/.venv/bin/python " +
                          TIGHTFIT_SOURCE_DIR + "/tests/peers/cpo_parity.py " + dir + " > " + dir +
                          "/peer.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file_text(dir + "/peer.log");
  const auto want = read_safetensors(dir + "/expected.safetensors").tensors;

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
  const TrainSummary sum = s->train();
  ASSERT_EQ(sum.losses.size(), 1u);
  EXPECT_NEAR(sum.losses[0], want.at("loss").item<double>(),
              1e-4 * std::max(1.0, std::abs(want.at("loss").item<double>())));
  std::ifstream metrics(sum.metrics_path);
  std::string line;
  std::getline(metrics, line);
  const auto rec = nlohmann::json::parse(line);
  for (const char* m : {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                        "rewards/margins", "logps/chosen", "logps/rejected", "nll_loss"}) {
    const std::string key = std::string("cpo.") + m;
    ASSERT_TRUE(rec.contains(key)) << line;
    const double w = want.at(std::string("metric.") + m).item<double>();
    EXPECT_NEAR(rec[key].get<double>(), w, 1e-4 * std::max(1.0, std::abs(w))) << m;
  }
  {
    at::NoGradGuard no_grad;  // the gradients, written under the peers' names
    for (Param* p : s->store().trainable()) {
      ASSERT_TRUE(p->value.grad().defined()) << p->name;
      p->value.copy_(p->value.grad());
    }
  }
  const std::string written =
      c.lora ? s->export_adapter(dir + "/grads") + "/adapter_model.safetensors"
             : s->export_hf(dir + "/grads", /*merge=*/false) + "/model.safetensors";
  const auto grads = read_safetensors(written).tensors;
  int compared = 0;
  for (const auto& [name, g] : grads) {
    ASSERT_TRUE(want.count("grad." + name)) << name;
    expect_close(g, want.at("grad." + name), "gradient of " + name);
    ++compared;
  }
  // A and B of 7 projections in 2 layers; or every weight of the model.
  if (c.lora)
    EXPECT_EQ(compared, 2 * 2 * 7);
  else
    EXPECT_EQ(compared, 2 * 9 + 3);
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

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// Recipes on the peer's tokenizer and preference rows.
class DpoRecipes : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = data_peer();
    std::ofstream(data_->str() + "/chat.jsonl")
        << R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})"
        << "\n";
  }
  static void TearDownTestSuite() { delete data_; }

  static std::string recipe(const std::string& out, const std::string& corpus,
                            const std::string& data_extra, const std::string& schedule,
                            const std::string& strategies, int64_t steps = 2,
                            const std::string& model =
                                "n_layer = 2\nn_embd = 32\nn_head = 4\nn_kv_head = 2\n"
                                "intermediate_size = 64\n",
                            int64_t seq_len = 96) {
    return "[run]\nname = \"r\"\nseed = 3\nsteps = " + std::to_string(steps) + "\nout_dir = \"" +
           out +
           "\"\nsample_tokens = 0\neval_batches = 1\nlog_every = 1000\n\n[model]\nplugin = "
           "\"llama\"\npreset = \"custom\"\nmax_positions = 128\n" +
           model + "\n[data]\ncorpus = \"" + corpus + "\"\ntokenizer = \"" + data_->str() +
           "/tokenizer.json\"\nseq_len = " + std::to_string(seq_len) +
           "\nbatch_size = 2\nval_fraction = 0.25\n" + data_extra +
           "\n[optimizer]\nlr = 1e-3\n\n[schedule]\n" + schedule + "warmup_steps = 0\n\n" +
           strategies;
  }
  static std::string rows() { return data_->str() + "/rows.jsonl"; }
  static constexpr const char* kLora = "[[strategy]]\nplugin = \"lora\"\n";
  static test::TempDir* data_;
};
test::TempDir* DpoRecipes::data_ = nullptr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// Preference pairs never train as plain rows: the standard schedule's pass
// refuses them rather than train on the rejected answers.
TEST_F(DpoRecipes, TheStandardScheduleRefusesPairs) {
  test::TempDir d;
  auto s = test::make_session(recipe(d.str(), rows(), "", "plugin = \"standard\"\n", kLora));
  const std::string e = error_of([&] { s->train(); });
  EXPECT_NE(e.find("preference pairs"), std::string::npos) << e;
  EXPECT_NE(e.find("schedule = \"dpo\""), std::string::npos) << e;
}

TEST_F(DpoRecipes, RecipesThatCannotWorkAreRefusedByName) {
  test::TempDir d;
  {
    // No adapters: no reference model without a second copy (not built yet).
    auto s = test::make_session(recipe(d.str(), rows(), "", "plugin = \"dpo\"\n", ""));
    const std::string e = error_of([&] { s->train(); });
    EXPECT_NE(e.find("no strategy holds adapters"), std::string::npos) << e;
  }
  {
    // Chat rows are not pairs.
    auto s = test::make_session(
        recipe(d.str(), data_->str() + "/chat.jsonl", "", "plugin = \"dpo\"\n", kLora));
    const std::string e = error_of([&] { s->train(); });
    EXPECT_NE(e.find("trains on preference pairs"), std::string::npos) << e;
  }
  const std::pair<std::string, std::string> bad_data[] = {
      {"max_length = 200\n", "do not fit a row of seq_len = 96"},
      {"packing = true\n", "preference pairs are two sequences each"},
      {"train_on = \"all\"\n", "score their completions only"},
  };
  for (const auto& [extra, message] : bad_data) {
    const std::string e = error_of(
        [&] { test::make_session(recipe(d.str(), rows(), extra, "plugin = \"dpo\"\n", kLora)); });
    EXPECT_NE(e.find(message), std::string::npos) << extra << ": " << e;
  }
  // A preference key on data without pairs would change nothing.
  const std::string e = error_of([&] {
    test::make_session(recipe(d.str(), data_->str() + "/chat.jsonl", "max_prompt_length = 64\n",
                              "plugin = \"standard\"\n", kLora));
  });
  EXPECT_NE(e.find("max_prompt_length shapes preference rows"), std::string::npos) << e;
  // label_smoothing is sigmoid's.
  const std::string ls = error_of([&] {
    test::make_session(recipe(d.str(), rows(), "",
                              "plugin = \"dpo\"\nloss_type = \"ipo\"\nlabel_smoothing = 0.1\n",
                              kLora));
  });
  EXPECT_NE(ls.find("label_smoothing applies to loss_type = \"sigmoid\""), std::string::npos) << ls;
}

// Training lowers the DPO loss on its pairs, logs TRL's metrics and reports
// the held-out pairs' DPO loss; the held-out split holds whole pairs.
TEST_F(DpoRecipes, TrainsLogsAndEvaluatesPairs) {
  test::TempDir d;
  auto s = test::make_session(recipe(d.str(), rows(), "", "plugin = \"dpo\"\n", kLora, 12));
  EXPECT_EQ(s->env().run_info.batch_size, 4);  // two pairs: four rows
  const TrainSummary sum = s->train();
  ASSERT_EQ(sum.losses.size(), 12u);
  EXPECT_NEAR(sum.losses.front(), std::log(2.0),
              1e-5);  // adapters start at B = 0: policy = reference
  EXPECT_LT(sum.losses.back(), sum.losses.front());
  EXPECT_TRUE(std::isfinite(sum.val_loss));
  std::ifstream metrics(sum.metrics_path);
  std::string line;
  std::getline(metrics, line);
  const auto first = nlohmann::json::parse(line);
  EXPECT_EQ(first["dpo.rewards/margins"].get<double>(), 0.0);  // policy = reference at step 1
  EXPECT_EQ(first["phase"], "dpo");
}

// A run stopped and resumed repeats the uninterrupted run's losses, with
// the strategies the schedule composes with (QLoRA, checkpointed blocks).
TEST_F(DpoRecipes, AResumedRunRepeatsTheUninterruptedOne) {
  for (const std::string& strategies :
       {std::string(kLora), std::string(kLora) + "[[strategy]]\nplugin = \"quantize\"\n"
                                                 "[[strategy]]\nplugin = \"checkpoint\"\n"}) {
    test::TempDir d;
    auto run = [&](const std::string& out, bool resume, int64_t stop_after) {
      SessionOptions o;
      o.resume = resume;
      o.stop_after_steps = stop_after;
      return test::make_session(recipe(out, rows(), "", "plugin = \"dpo\"\n", strategies, 6), o)
          ->train();
    };
    const TrainSummary full = run(d.str() + "/a", false, -1);
    run(d.str() + "/b", false, 3);
    const TrainSummary second = run(d.str() + "/b", true, -1);
    ASSERT_EQ(full.losses.size(), 6u);
    ASSERT_EQ(second.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(second.losses[i], full.losses[3 + i]) << strategies << " step " << 3 + i;
  }
}

// The plan counts a pair's two rows: its peak within the same 10% of the
// measured one as the other recipes' (test_planned_peak.cpp). A batch of
// pairs is as long as its longest row, and the plan counts seq_len (the
// longest a batch can be): seq_len here is the longest pair's, 60 tokens.
TEST_F(DpoRecipes, PlannedPeakIsWithinTenPercentOfTheMeasuredPeak) {
  test::TempDir d;
  const std::string text =
      recipe(d.str(), rows(), "", "plugin = \"dpo\"\n", kLora, 3,
             "n_layer = 4\nn_embd = 256\nn_head = 4\nn_kv_head = 2\nintermediate_size = 688\n", 60);
  const MemoryPlan plan = test::plan_of(text);
  EXPECT_TRUE(plan.unestimated.empty());
  const TrainSummary sum = test::make_session(text)->train();
  const int64_t measured = sum.memory.total_peak - sum.memory.peak[TF_MEM_OTHER];
  std::cout << "dpo: planned " << format_bytes(plan.tracked_peak) << ", measured "
            << format_bytes(measured) << "\n";
  EXPECT_LE(std::abs(test::relative(plan.tracked_peak, measured)), 0.10)
      << "planned " << format_bytes(plan.tracked_peak) << " (" << plan.peak_moment << "), measured "
      << format_bytes(measured);
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// The cpo schedule in recipes: what it cannot do is refused by name; it
// trains a whole model (no reference needed), evaluates, resumes exactly
// and is planned within the others' 10%.
class CpoRecipes : public DpoRecipes {
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
