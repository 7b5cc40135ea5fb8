// Preference rows to prompt, chosen and rejected ids, against TRL's
// DPOTrainer (its prepared dataset and the sequences its concatenated
// forward gives the model); malformed rows named by file:line and field.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "bpe_tokenizer.hpp"
#include "example_batcher.hpp"
#include "preference_data.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

using ojson = nlohmann::ordered_json;

class PreferenceData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                            "/tests/peers/dpo_data.py " + dir_->str() + " > " + dir_->str() +
                            "/peer.log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "the TRL peer failed; scripts/setup installs trl";
  }
  static void TearDownTestSuite() { delete dir_; }
  static test::TempDir* dir_;
};
test::TempDir* PreferenceData::dir_ = nullptr;

PreferenceOptions options_of(const ojson& o) {
  PreferenceOptions p;
  p.max_prompt_length = o["max_prompt_length"].get<int64_t>();
  p.max_completion_length = o["max_completion_length"].get<int64_t>();
  p.max_length = o["max_length"].get<int64_t>();
  p.keep_end = o["keep_end"].get<bool>();
  return p;
}

// Every row form (text and conversational, explicit and implicit prompt, a
// continued assistant message), with TRL's defaults and with short limits
// in both truncation modes: the same ids as TRL's, and the same sequences.
TEST_F(PreferenceData, IdsAndSequencesEqualTrlsDpoTrainer) {
  auto tok = BpeTokenizer::load(dir_->str());
  const ChatFormatter chat(*tok, TokenizerConfig::load(dir_->str()), TrainOn::kCompletion);
  std::ifstream in(dir_->str() + "/expected.json");
  const ojson expected = ojson::parse(in);
  ASSERT_EQ(expected.size(), 3u);
  for (const auto& [name, want] : expected.items()) {
    const PreferenceFormatter formatter(chat, options_of(want["options"]));
    std::vector<ojson> rows;
    std::ifstream rows_in(dir_->str() + "/rows.jsonl");
    for (std::string line; std::getline(rows_in, line);) rows.push_back(ojson::parse(line));
    ASSERT_EQ(rows.size(), want["pairs"].size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const PreferencePair p = formatter.format(rows[i], "row " + std::to_string(i));
      const ojson& w = want["pairs"][i];
      EXPECT_EQ(p.prompt, w["prompt_input_ids"].get<std::vector<int64_t>>())
          << name << " row " << i;
      EXPECT_EQ(p.chosen, w["chosen_input_ids"].get<std::vector<int64_t>>())
          << name << " row " << i;
      EXPECT_EQ(p.rejected, w["rejected_input_ids"].get<std::vector<int64_t>>())
          << name << " row " << i;
    }
    const std::vector<Example> seq =
        load_preference_examples(dir_->str() + "/rows.jsonl", formatter);
    ASSERT_EQ(seq.size(), 2 * rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const ojson& w = want["sequences"][i];
      EXPECT_EQ(seq[2 * i].ids, w[0].get<std::vector<int64_t>>()) << name << " chosen " << i;
      EXPECT_EQ(seq[2 * i + 1].ids, w[1].get<std::vector<int64_t>>()) << name << " rejected " << i;
    }
  }
}

// Tokenized jointly (a schedule's preference_tokenization = "joint"), every
// row form with TRL's CPOTrainer defaults and short limits in both
// truncation modes: each side's ids and trained tokens (labels not -100)
// equal those of CPOTrainer's prepared dataset, BOS and all.
TEST_F(PreferenceData, JointIdsEqualTrlsCpoTrainer) {
  auto tok = BpeTokenizer::load(dir_->str());
  const ChatFormatter chat(*tok, TokenizerConfig::load(dir_->str()), TrainOn::kCompletion);
  std::ifstream in(dir_->str() + "/expected_joint.json");
  const ojson expected = ojson::parse(in);
  ASSERT_EQ(expected.size(), 3u);
  for (const auto& [name, want] : expected.items()) {
    PreferenceOptions options = options_of(want["options"]);
    options.joint = true;
    const PreferenceFormatter formatter(chat, options);
    const std::vector<Example> seq =
        load_preference_examples(dir_->str() + "/rows.jsonl", formatter);
    ASSERT_EQ(seq.size(), 2 * want["rows"].size()) << name;
    for (size_t i = 0; i < want["rows"].size(); ++i) {
      const ojson& w = want["rows"][i];
      ASSERT_FALSE(w.contains("error")) << name << " row " << i << ": " << w.dump();
      for (const char* side : {"chosen", "rejected"}) {
        const Example& e = seq[2 * i + (std::string(side) == "rejected" ? 1 : 0)];
        EXPECT_EQ(e.ids, w[std::string(side) + "_input_ids"].get<std::vector<int64_t>>())
            << name << " row " << i << " " << side;
        std::vector<uint8_t> trained;
        for (const auto& label : w[std::string(side) + "_labels"])
          trained.push_back(label.get<int64_t>() != -100 ? 1 : 0);
        EXPECT_EQ(e.trained, trained) << name << " row " << i << " " << side;
      }
    }
  }
}

// Joint tokenization that TRL would cut to nothing, or that merges more than
// the prompt's last token, is refused by file:line.
TEST_F(PreferenceData, JointRowsThatCannotBeCutAreRefused) {
  auto tok = BpeTokenizer::load(dir_->str());
  const ChatFormatter chat(*tok, TokenizerConfig::load(dir_->str()), TrainOn::kCompletion);
  PreferenceOptions options;
  options.joint = true;
  options.max_length = 8;
  options.max_prompt_length = 8;  // no room left for the answers
  const PreferenceFormatter formatter(chat, options);
  const ojson row = ojson::parse(
      R"({"prompt": "The sky is very very blue", "chosen": " blue", "rejected": " green"})");
  try {
    formatter.format(row, "rows.jsonl:3");
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rows.jsonl:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_prompt_length below max_length"), std::string::npos)
        << e.what();
  }
  options.max_prompt_length = 4;
  const PreferencePair p = PreferenceFormatter(chat, options).format(row, "rows.jsonl:3");
  EXPECT_LE(p.chosen_prompt.size() + p.chosen.size(), 8u);
}

// A BOS or EOS the tokenizer's config names but its vocabulary lacks would
// be dropped from every row: refused by name with the fix.
TEST_F(PreferenceData, ASpecialTokenOutsideTheVocabularyIsRefused) {
  auto tok = BpeTokenizer::load(dir_->str());
  for (const bool bos : {true, false}) {
    TokenizerConfig config = TokenizerConfig::load(dir_->str());
    (bos ? config.bos_token : config.eos_token) = "<not-a-token>";
    const ChatFormatter chat(*tok, config, TrainOn::kCompletion);
    PreferenceOptions options;
    options.joint = bos;
    try {
      const PreferenceFormatter formatter(chat, options);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      const std::string want = std::string(bos ? "bos_token" : "eos_token") +
                               " \"<not-a-token>\", which is not a token of its vocabulary";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

// The trained tokens are the completion's, wherever max_length cuts.
TEST(PreferenceSequence, TrainsTheCompletionAsCut) {
  PreferenceOptions o;
  o.max_length = 4;
  const Example end = preference_sequence({1, 2, 3}, {7, 8, 9}, o);
  EXPECT_EQ(end.ids, (std::vector<int64_t>{3, 7, 8, 9}));
  EXPECT_EQ(end.trained, (std::vector<uint8_t>{0, 1, 1, 1}));
  o.keep_end = false;
  const Example start = preference_sequence({1, 2, 3}, {7, 8, 9}, o);
  EXPECT_EQ(start.ids, (std::vector<int64_t>{1, 2, 3, 7}));
  EXPECT_EQ(start.trained, (std::vector<uint8_t>{0, 0, 0, 1}));
  o.max_length = 0;
  EXPECT_EQ(preference_sequence({1}, {2, 3}, o).ids.size(), 3u);
}

TEST_F(PreferenceData, MalformedRowsNameFileLineAndField) {
  auto tok = BpeTokenizer::load(dir_->str());
  const ChatFormatter chat(*tok, TokenizerConfig::load(dir_->str()), TrainOn::kCompletion);
  const PreferenceFormatter formatter(chat, {});
  const std::pair<const char*, const char*> cases[] = {
      {R"({"prompt": "p", "chosen": "c"})", "needs \"chosen\" and \"rejected\""},
      {R"({"prompt": "p", "chosen": 1, "rejected": "r"})", "\"chosen\" must be a string"},
      {R"({"chosen": "abc ", "rejected": "xyz"})", "share no beginning"},
      {R"({"chosen": [{"role": "user", "content": "a"}], "rejected": [{"role": "user", "content": "b"}]})",
       "share no beginning"},
      {R"({"chosen": "same", "rejected": ["list"]})", "both be strings or both be lists"},
      {R"({"prompt": [{"role": "system", "content": "s"}], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]})",
       "last message is \"system\""},
      {R"({"prompt": [{"role": "user", "content": 3}], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]})",
       "\"prompt\"[0].content must be a string"},
      {R"({"prompt": "p", "chosen": "c", "rejected": "r", "tools": []})",
       "\"tools\" in a preference row"},
      {R"([1])", "a row must be a JSON object"},
  };
  test::TempDir d;
  for (const auto& [row, message] : cases) {
    const std::string file = d.str() + "/rows.jsonl";
    std::ofstream(file) << "\n" << row << "\n";
    try {
      load_preference_examples(file, formatter);
      ADD_FAILURE() << "accepted " << row;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(file + ":2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// Pairs stay together: held out and shuffled as pairs, and a batch holds
// every chosen row, then every rejected row of the same pairs in order.
TEST(PreferenceBatches, KeepPairsTogether) {
  std::vector<Example> examples;
  for (int64_t k = 0; k < 6; ++k) {
    // pair k: prompt token k, chosen answer 100 + k, rejected answer 200 + k
    for (const int64_t answer : {100 + k, 200 + k}) {
      Example e;
      e.ids = {k, answer, 7};
      e.trained = {0, 1, 1};
      examples.push_back(e);
    }
  }
  ExampleBatcher batcher(examples, 8, 2, 5, 0.34, 9, false, /*pairs=*/true);
  EXPECT_EQ(batcher.counts().examples, 6);
  EXPECT_EQ(batcher.counts().validation, 2);
  EXPECT_EQ(batcher.counts().train, 4);
  std::set<int64_t> train_prompts, val_prompts;
  for (int step = 0; step < 4; ++step) {
    const Batcher::Batch b = batcher.next();
    ASSERT_EQ(b.pairs, 2);
    ASSERT_EQ(b.tokens.size(0), 4);
    for (int64_t i = 0; i < 2; ++i) {
      const int64_t prompt = b.tokens[i][0].item<int64_t>();
      EXPECT_EQ(b.tokens[2 + i][0].item<int64_t>(), prompt);        // the same pair
      EXPECT_EQ(b.tokens[i][1].item<int64_t>(), 100 + prompt);      // chosen first
      EXPECT_EQ(b.tokens[2 + i][1].item<int64_t>(), 200 + prompt);  // then rejected
      EXPECT_EQ(b.targets[i][0].item<int64_t>(), 100 + prompt);     // the answer is the target
      train_prompts.insert(prompt);
    }
  }
  for (int64_t v = 0; v < 2; ++v) {
    const Batcher::Batch b = batcher.validation(v);
    ASSERT_EQ(b.pairs, 2);
    for (int64_t i = 0; i < 2; ++i) val_prompts.insert(b.tokens[i][0].item<int64_t>());
  }
  EXPECT_EQ(train_prompts.size(), 4u);
  EXPECT_EQ(val_prompts.size(), 2u);
  for (const int64_t p : val_prompts) EXPECT_EQ(train_prompts.count(p), 0u) << p;
  // Packing would put a pair's two sides in one row's company of others.
  EXPECT_THROW(ExampleBatcher(examples, 8, 2, 5, 0.0, 9, true, true), std::invalid_argument);
}

}  // namespace
}  // namespace tightfit
