// Preference rows to prompt, chosen and rejected ids, against TRL's
// DPOTrainer (its prepared dataset and the sequences its concatenated
// forward gives the model); malformed rows named by file:line and field.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bpe_tokenizer.hpp"
#include "preference_data.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

using ojson = nlohmann::ordered_json;

class PreferenceData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string cmd = std::string(TIGHTFIT_SOURCE_DIR) + "/.venv/bin/python " +
                            TIGHTFIT_SOURCE_DIR + "/tests/peers/dpo_data.py " + dir_->str() +
                            " > " + dir_->str() + "/peer.log 2>&1";
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
