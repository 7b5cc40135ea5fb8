// What the preference-schedule tests share (test_dpo.cpp, test_cpo.cpp):
// the TRL data peer's tokenizer and rows, the batch layout of pairs, the
// comparison of one step with a TRL peer's, and recipes on the peer's data.
#pragma once

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

namespace tightfit::preference_test {

namespace fs = std::filesystem;

constexpr int64_t kSeqLen = 96;

// The data test's peer (tests/peers/dpo_data.py): a tokenizer with a chat
// template and preference rows of every form, in a new folder.
inline test::TempDir* data_peer() {
  auto* dir = new test::TempDir();
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                          "/tests/peers/dpo_data.py " + dir->str() + " > " + dir->str() +
                          "/peer.log 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "the TRL peer failed; scripts/setup installs trl";
  return dir;
}

// A seeded 2-layer LlamaForSequenceClassification saved by transformers on
// `dir`/tokenizer, in `dir`/scorer (tests/peers/scorer_model.py); with
// `dir`/texts.json, also its scores of them in `dir`/expected.json.
inline void make_scorer_peer(const std::string& dir) {
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                          "/tests/peers/scorer_model.py " + dir + " > " + dir + "/scorer.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file_text(dir + "/scorer.log");
}

// A parity test's folder: the data peer's tokenizer (in tokenizer/) and rows.
inline void copy_peer_data(const test::TempDir& data, const test::TempDir& d) {
  fs::create_directories(d.path() / "tokenizer");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(data.path() / f, d.path() / "tokenizer" / f);
  fs::copy_file(data.path() / "rows.jsonl", d.path() / "rows.jsonl");
}

// A 2-layer, 4-expert Mixtral whose config.json asks for the routers'
// load-balancing loss (output_router_logits, router_aux_loss_coef 0.05), on
// the tokenizer in `dir`/tokenizer: `recipe` with it as its [model] and
// without its strategies. Its weights: every expert's three, the router,
// attention's four and two norms a layer, and the embedding, norm and head.
constexpr int kMoeWeights = 2 * (4 * 3 + 1 + 4 + 2) + 3;
inline std::string with_moe_model(const std::string& dir, std::string recipe) {
  const int64_t vocab = BpeTokenizer::load(dir + "/tokenizer")->vocab_size();
  fs::create_directories(dir + "/moe");
  std::ofstream(dir + "/moe/config.json") << nlohmann::json({{"model_type", "mixtral"},
                                                             {"num_hidden_layers", 2},
                                                             {"hidden_size", 32},
                                                             {"num_attention_heads", 4},
                                                             {"num_key_value_heads", 2},
                                                             {"intermediate_size", 48},
                                                             {"vocab_size", vocab},
                                                             {"max_position_embeddings", 128},
                                                             {"num_local_experts", 4},
                                                             {"num_experts_per_tok", 2},
                                                             {"rope_theta", 10000.0},
                                                             {"output_router_logits", true},
                                                             {"router_aux_loss_coef", 0.05}})
                                                 .dump();
  recipe = recipe.substr(0, recipe.find("[[strategy]]"));
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin,
                 "[model]\nplugin = \"llama\"\nconfig = \"" + dir + "/moe\"\n\n");
  return recipe;
}

// Runs a TRL peer (tests/peers/`script`) on `dir` and reads what it expects;
// empty (and a failure recorded, with the peer's log) when it failed.
inline std::map<std::string, at::Tensor> run_trl_peer(const std::string& script,
                                                      const std::string& dir) {
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR + "/tests/peers/" +
                          script + " " + dir + " > " + dir + "/peer.log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << script << " failed: " << read_file_text(dir + "/peer.log");
    return {};
  }
  return read_safetensors(dir + "/expected.safetensors").tensors;
}

// Trainable weights (adapters) moved away from their start (LoRA's B = 0
// would make the policy its own reference), the same way in every test.
inline void randomize_trainable(Session& s, uint64_t seed = 11, double scale = 0.2) {
  at::NoGradGuard no_grad;
  at::manual_seed(seed);
  for (Param* p : s.store().trainable()) p->value.copy_(at::randn_like(p->value) * scale);
}

// The rows as the batcher lays out pairs: every chosen row, then every rejected one.
inline std::pair<at::Tensor, at::Tensor> rows_batch(const std::vector<Example>& seq, int64_t pad) {
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

inline void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = std::max(1e-3, want.abs().max().item<double>());
  const double diff = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
  EXPECT_LE(diff, 1e-4 * scale) << what << ": max |diff| " << diff << " at scale " << scale;
}

// One step at lr 0 over all the pairs, against the peer's: the loss, the
// metrics the schedule logs (with its plugin's prefix) and every trained
// gradient, written under the peer's names (PEFT's adapter keys, or
// transformers' names without adapters). Returns how many gradients matched
// a peer's; -1 when the step or a name was missing.
inline int expect_step_equals_peer(Session& s, const std::map<std::string, at::Tensor>& want,
                                   const std::string& prefix,
                                   const std::vector<const char*>& metrics, bool adapters,
                                   const std::string& dir) {
  const TrainSummary sum = s.train();
  if (sum.losses.size() != 1u) {
    ADD_FAILURE() << sum.losses.size() << " steps, not 1";
    return -1;
  }
  EXPECT_NEAR(sum.losses[0], want.at("loss").item<double>(),
              1e-4 * std::max(1.0, std::abs(want.at("loss").item<double>())));
  // The step's record: the file's last (a resumed run appends to it).
  std::ifstream in(sum.metrics_path);
  std::string line;
  for (std::string next; std::getline(in, next);)
    if (!next.empty()) line = next;
  const auto rec = nlohmann::json::parse(line);
  for (const char* m : metrics) {
    // A plugin's metrics carry its name: "dpo.rewards/chosen".
    const std::string key = prefix + "." + m;
    if (!rec.contains(key)) {
      ADD_FAILURE() << key << " not in " << line;
      return -1;
    }
    const double w = want.at(std::string("metric.") + m).item<double>();
    EXPECT_NEAR(rec[key].get<double>(), w, 1e-4 * std::max(1.0, std::abs(w))) << m;
  }
  {
    at::NoGradGuard no_grad;  // the gradients, written by the exporters
    for (Param* p : s.store().trainable()) {
      if (!p->value.grad().defined()) {
        ADD_FAILURE() << p->name << " has no gradient";
        return -1;
      }
      p->value.copy_(p->value.grad());
    }
  }
  const std::string written =
      adapters ? s.export_adapter(dir + "/grads") + "/adapter_model.safetensors"
               : s.export_hf(dir + "/grads", /*merge=*/false) + "/model.safetensors";
  int compared = 0;
  for (const auto& [name, g] : read_safetensors(written).tensors) {
    if (!want.count("grad." + name)) {
      ADD_FAILURE() << name << " has no peer gradient";
      return -1;
    }
    expect_close(g, want.at("grad." + name), "gradient of " + name);
    ++compared;
  }
  return compared;
}

// Recipes on the peer's tokenizer and preference rows.
class PreferenceRecipes : public ::testing::Test {
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
  static inline test::TempDir* data_ = nullptr;
};

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace tightfit::preference_test
