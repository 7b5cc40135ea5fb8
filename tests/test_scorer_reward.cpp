// The scorer_model reward's model (score_texts, ABI 1.28) against
// transformers: a LlamaForSequenceClassification saved by transformers
// (tests/peers/scorer_model.py), the texts and conversations scored as
// TRL's GRPOTrainer scores a reward model's, then what it refuses and what
// the plan counts of it.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "memory_plan.hpp"
#include "preference_test_support.hpp"

namespace tightfit {
namespace {

using namespace preference_test;

class ScorerModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { data_ = data_peer(); }
  static void TearDownTestSuite() { delete data_; }
  static test::TempDir* data_;
};
test::TempDir* ScorerModel::data_ = nullptr;

// A run on the data peer's tokenizer, whatever it trains: it opens scorers.
std::string plain_recipe(const std::string& dir) {
  return "[run]\nname = \"s\"\nsteps = 1\nout_dir = \"" + dir +
         "\"\nsample_tokens = 0\neval_batches = 0\n\n"
         "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 1\nn_embd = 16\nn_head = "
         "2\nintermediate_size = 32\nmax_positions = 64\n\n"
         "[data]\ncorpus = \"" +
         dir + "/rows.jsonl\"\ntokenizer = \"" + dir + "/tokenizer\"\nseq_len = 32\n";
}

const std::vector<std::string> kTexts = {
    "The sky is blue",
    // Ends with the pad token (the EOS, as the tokenizer has no pad): the
    // score is read before it.
    "hello memory</s>",
    "</s>",  // every token the pad token: read at the first
    "日本語 🙂 streamed in the layer of the disk, GPU memory memory memory",
    "Paris</s></s>",
};
const nlohmann::json kMessages = {
    {{{"role", "user"}, {"content", "What is 2 + 2?"}}, {{"role", "assistant"}, {"content", "4"}}},
    {{{"role", "system"}, {"content", "Be terse."}},
     {{"role", "user"}, {"content", "What is 2 + 2?"}},
     {{"role", "assistant"}, {"content", "The answer is 4"}}},
};

// Each text's scores of both labels, as tightfit's scorer gives them.
std::vector<std::vector<double>> both_labels(TextScorer& s, const std::vector<std::string>& texts,
                                             bool messages, int64_t batch_rows) {
  std::vector<std::vector<double>> out(texts.size());
  for (int64_t label = 0; label < 2; ++label) {
    const std::vector<double> v = s.score(texts, messages, label, batch_rows);
    EXPECT_EQ(v.size(), texts.size());
    for (size_t i = 0; i < v.size() && i < texts.size(); ++i) out[i].push_back(v[i]);
  }
  return out;
}

void expect_near_peer(const std::vector<std::vector<double>>& got, const nlohmann::json& want,
                      const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    for (size_t l = 0; l < 2; ++l) {
      const double w = want[i][l].get<double>();
      EXPECT_NEAR(got[i][l], w, 1e-4 * std::max(1.0, std::abs(w))) << what << " row " << i;
    }
}

TEST_F(ScorerModel, ScoresEqualTransformersForTextsAndConversations) {
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  std::ofstream(dir + "/texts.json")
      << nlohmann::json({{"texts", kTexts}, {"messages", kMessages}});
  ASSERT_NO_FATAL_FAILURE(make_scorer_peer(dir));
  const nlohmann::json want = nlohmann::json::parse(read_file_text(dir + "/expected.json"));
  // The scores differ from row to row and from label to label: a pooling at
  // the wrong token would show.
  ASSERT_NE(want["texts"][0][0].get<double>(), want["texts"][1][0].get<double>());
  ASSERT_GT(std::abs(want["texts"][0][0].get<double>()), 0.05);

  auto s = test::make_session(plain_recipe(dir), SessionOptions{.skip_data = true});
  const std::shared_ptr<TextScorer> scorer = s->open_scorer(dir + "/scorer");
  EXPECT_EQ(scorer->num_labels(), 2);
  EXPECT_EQ(scorer->positions(), 128);
  // A second ask is the same model, opened once.
  EXPECT_EQ(s->open_scorer(dir + "/scorer/.").get(), scorer.get());
  // All rows in one pass (right-padded to the longest), and two at a time.
  for (const int64_t rows : {0, 2}) {
    SCOPED_TRACE(rows);
    expect_near_peer(both_labels(*scorer, kTexts, false, rows), want["texts"], "texts");
    std::vector<std::string> conversations;
    for (const auto& m : kMessages) conversations.push_back(m.dump());
    expect_near_peer(both_labels(*scorer, conversations, true, rows), want["messages"], "messages");
  }
  // 4 bytes a weight: the embedding, two blocks and the 2-row score head.
  const int64_t V =
      nlohmann::json::parse(read_file_text(dir + "/scorer/config.json"))["vocab_size"];
  const int64_t C = 32, F = 64, kv = 16;
  const int64_t block = 2 * C + C * C * 2 + 2 * C * kv + 3 * C * F;
  EXPECT_EQ(scorer->weight_bytes(), 4 * (V * C + 2 * block + C + 2 * C));
}

// What cannot be scored is refused naming the folder or the row and what to
// do; nothing is scored from a vocabulary's logits.
TEST_F(ScorerModel, WhatCannotBeScoredIsRefusedByName) {
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  ASSERT_NO_FATAL_FAILURE(make_scorer_peer(dir));
  auto s = test::make_session(plain_recipe(dir), SessionOptions{.skip_data = true});
  // Not a folder; a causal LM's folder.
  std::string e = error_of([&] { s->open_scorer(dir + "/nothing"); });
  EXPECT_NE(e.find("not a folder"), std::string::npos) << e;
  s->export_hf(dir + "/causal");
  e = error_of([&] { s->open_scorer(dir + "/causal"); });
  EXPECT_NE(e.find("not a *ForSequenceClassification model"), std::string::npos) << e;
  // A config whose labels disagree with its head's rows.
  fs::create_directories(dir + "/three");
  for (const auto& f : fs::directory_iterator(dir + "/scorer"))
    fs::copy_file(f.path(), dir + "/three/" + f.path().filename().string());
  nlohmann::json cfg = nlohmann::json::parse(read_file_text(dir + "/three/config.json"));
  cfg["id2label"] = {{"0", "a"}, {"1", "b"}, {"2", "c"}};
  std::ofstream(dir + "/three/config.json") << cfg.dump();
  e = error_of([&] { s->open_scorer(dir + "/three"); });
  EXPECT_NE(e.find("three"), std::string::npos) << e;
  // A text longer than the model's positions; a conversation that is not one.
  const std::shared_ptr<TextScorer> scorer = s->open_scorer(dir + "/scorer");
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += " memory";
  e = error_of([&] { scorer->score({"short", long_text}, false, 0, 0); });
  EXPECT_NE(e.find("score_texts row 1"), std::string::npos) << e;
  EXPECT_NE(e.find("max_position_embeddings"), std::string::npos) << e;
  e = error_of([&] { scorer->score({R"([{"role": 3}])"}, true, 0, 0); });
  EXPECT_NE(e.find("score_texts row 0"), std::string::npos) << e;
  // No token at all: transformers would read it from a row of padding its
  // attention mask hides entirely.
  e = error_of([&] { scorer->score({"hello", ""}, false, 0, 0); });
  EXPECT_NE(e.find("score_texts row 1: no tokens"), std::string::npos) << e;
}

// A GRPO recipe with the scorer_model reward: a planned run composes the
// reward model without reading it and counts its weights, all of them,
// held through the step; a run holds exactly that.
TEST_F(ScorerModel, ThePlanCountsTheRewardModelsWeights) {
  test::TempDir d;
  const std::string dir = d.str();
  copy_peer_data(*data_, d);
  ASSERT_NO_FATAL_FAILURE(make_scorer_peer(dir));
  std::ofstream(dir + "/prompts.jsonl")
      << R"({"prompt": [{"role": "user", "content": "Name a colour."}]})"
      << "\n";
  std::string recipe = plain_recipe(dir);
  recipe.replace(recipe.find("rows.jsonl"), 10, "prompts.jsonl");
  recipe +=
      "batch_size = 1\nval_fraction = 0\n\n[schedule]\nplugin = \"grpo\"\nnum_generations = "
      "2\nmax_completion_length = 4\n\n[[reward]]\nplugin = \"scorer_model\"\nmodel = \"" +
      dir + "/scorer\"\n";
  SessionOptions planned;
  planned.dry_run = true;
  auto s = test::make_session(recipe, planned);
  const MemoryPlan plan = plan_memory(s->parts());
  int64_t counted = -1;
  for (const PlanContribution& c : plan.contributions)
    if (c.plugin == "reward scorer_model") counted = c.delta[TF_TIER_DEVICE][TF_MEM_WEIGHTS];
  auto run = test::make_session(recipe);
  const int64_t held = run->open_scorer(dir + "/scorer")->weight_bytes();
  EXPECT_GT(held, 100'000);
  EXPECT_EQ(counted, held);
  // And the run trains with its scores.
  const TrainSummary sum = run->train();
  ASSERT_EQ(sum.losses.size(), 1u);
  std::ifstream in(sum.metrics_path);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) last = line;
  EXPECT_TRUE(
      std::isfinite(nlohmann::json::parse(last)["grpo.rewards/scorer_model/mean"].get<double>()))
      << last;
}

}  // namespace
}  // namespace tightfit
