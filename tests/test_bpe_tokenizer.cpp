// BPE from tokenizer.json gives the ids Hugging Face `tokenizers` gives, in
// every style the supported families ship (byte-level: GPT-2, Llama 3, Qwen2;
// SentencePiece-style: Llama 2, Mistral, an NFKC one), on varied text and a
// corpus of hard strings, special tokens and post-processors included.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bpe_tokenizer.hpp"
#include "data.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

class BpeParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                            "/tests/peers/bpe_parity.py " + dir_->str();
    ASSERT_EQ(std::system(cmd.c_str()), 0)
        << "the Python peer failed; scripts/setup installs tokenizers";
  }
  static void TearDownTestSuite() { delete dir_; }
  static nlohmann::json read_json(const std::string& name) {
    std::ifstream in(dir_->str() + "/" + name);
    return nlohmann::json::parse(in);
  }
  void compare(const std::string& style) {
    auto tok = BpeTokenizer::load(dir_->str() + "/" + style);
    const auto lines = read_json("lines.json");
    const auto want_all = read_json(style + ".ids.json");
    EXPECT_EQ(tok->vocab_size(), want_all["vocab_size"].get<int64_t>());
    const auto& ids = want_all["ids"];
    const auto& decoded = want_all["decoded"];
    ASSERT_EQ(lines.size(), ids.size());
    size_t mismatches = 0, decode_mismatches = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string line = lines[i].get<std::string>();
      const std::vector<int64_t> got = tok->encode(line, /*add_special_tokens=*/true);
      const std::vector<int64_t> want = ids[i].get<std::vector<int64_t>>();
      if (got != want && ++mismatches <= 3)
        ADD_FAILURE() << style << " line " << i << ": \"" << line << "\"\n got  "
                      << ::testing::PrintToString(got) << "\n want "
                      << ::testing::PrintToString(want);
      const std::string text = tok->decode(want);
      if (text != decoded[i].get<std::string>() && ++decode_mismatches <= 3)
        ADD_FAILURE() << style << " decode of line " << i << ": \"" << text << "\" vs \""
                      << decoded[i].get<std::string>() << "\"";
    }
    EXPECT_EQ(mismatches, 0u) << "of " << lines.size() << " lines";
    EXPECT_EQ(decode_mismatches, 0u) << "of " << lines.size() << " lines";
    RecordProperty("lines_compared", static_cast<int>(lines.size()));
  }
  static test::TempDir* dir_;
};
test::TempDir* BpeParity::dir_ = nullptr;

TEST_F(BpeParity, Gpt2StyleMatchesTokenizers) {
  compare("gpt2");
}
TEST_F(BpeParity, Llama3StyleMatchesTokenizers) {
  compare("llama3");
}
TEST_F(BpeParity, Qwen2StyleMatchesTokenizers) {
  compare("qwen2");
}
TEST_F(BpeParity, Llama2SentencePieceStyleMatchesTokenizers) {
  compare("llama2");
}
TEST_F(BpeParity, MistralMetaspaceStyleMatchesTokenizers) {
  compare("mistral");
}
TEST_F(BpeParity, NfkcMetaspaceStyleMatchesTokenizers) {
  compare("nfkc");
}

// BPE merges by a heap over linked symbols: a megabyte-long word (the whole
// input one piece) and a megabyte-long line must not take quadratic time.
// The bound is loose (a quadratic merge takes minutes); the figure is recorded.
// Added tokens found in one pass (kernel/text/added_token_matcher.cpp) as the
// tokenizers library finds them: leftmost-longest, overlapping texts, single
// words, spaces stripped on either side.
TEST_F(BpeParity, AddedTokensMatchTokenizers) {
  compare("added");
}

TEST_F(BpeParity, MegabyteWordAndLineEncodeQuickly) {
  std::string word;
  for (size_t i = 0; i < (size_t{1} << 20); ++i) word += static_cast<char>('a' + (i * 7919) % 26);
  std::string merged_word;  // one word the trained merges shorten a lot
  while (merged_word.size() < (1u << 20)) merged_word += "memorybudgetcheckpoint";
  std::string line;
  while (line.size() < (1u << 20)) line += "the memory budget of a naïve checkpoint 3.14159, ";
  for (const std::string style : {"gpt2", "llama2", "mistral"}) {
    auto tok = BpeTokenizer::load(dir_->str() + "/" + style);
    for (const std::string* text : {&word, &merged_word, &line}) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto ids = tok->encode(*text);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_FALSE(ids.empty());
      EXPECT_LT(s, 10.0) << style;
      const char* what = text == &word ? "word" : text == &line ? "line" : "merged_word";
      RecordProperty(style + "_" + what + "_s", std::to_string(s));
      std::cout << style << " 1 MB " << what << ": " << s << " s, " << ids.size() << " tokens\n";
    }
  }
}

TEST_F(BpeParity, RecipeUsesTheTokenizerAndItsVocabulary) {
  test::TempDir d;
  std::string r = test::tiny_recipe(test::write_corpus(d), d.str());
  r.replace(r.find("tokenizer = \"byte\""), 18, "tokenizer = \"" + dir_->str() + "/gpt2\"");
  auto s = test::make_session(r);
  EXPECT_EQ(s->env().run_info.vocab_size, 600);
  EXPECT_EQ(s->store().get("transformer.wte.weight").shape[0], 600);
  auto b = s->data().batcher().next();
  EXPECT_LT(b.tokens.max().item<int64_t>(), 600);
}

// A corpus that is not UTF-8 is refused for a tokenizer.json (which reads
// text), naming the byte and line; the byte tokenizer trains on it.
TEST_F(BpeParity, CorpusWithInvalidUtf8IsRefusedNamingWhere) {
  test::TempDir d;
  std::string latin1 = "ok line\n";
  for (int i = 0; i < 100; ++i) latin1 += "caf\xe9 au lait\n";
  const std::string corpus = test::write_file(d, "latin1.txt", latin1);
  std::string r = test::tiny_recipe(corpus, d.str());
  r.replace(r.find("seq_len = 32"), 12, "seq_len = 4");
  r.replace(r.find("tokenizer = \"byte\""), 18, "tokenizer = \"" + dir_->str() + "/gpt2\"");
  try {
    test::make_session(r);
    FAIL() << "a latin-1 corpus was tokenized";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("not valid UTF-8 (byte 11 of its text, line 2)"), std::string::npos) << m;
    EXPECT_NE(m.find("tokenizer = \"byte\""), std::string::npos) << m;
  }
  EXPECT_EQ(
      test::make_session(test::tiny_recipe(corpus, d.str() + "/b"))->env().run_info.vocab_size,
      256);
}

TEST(Utf8, FindsTheFirstMalformedByte) {
  const std::pair<std::string, size_t> cases[] = {
      {"plain ascii", std::string::npos},
      {"caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x99\x82", std::string::npos},  // é 日 🙂
      {"caf\xe9", 3},                                                    // latin-1 é
      {"ab\xc3", 2},                                                     // cut sequence
      {"\xc0\xaf", 0},                                                   // overlong '/'
      {"x\xe0\x80\xaf", 1},                                              // overlong, 3 bytes
      {"\xed\xa0\x80", 0},                                               // surrogate U+D800
      {"\xf4\x90\x80\x80", 0},                                           // past U+10FFFF
      {"ok \xe6\x97", 3},                                                // cut at the end
      {"\xe6\x97\x41", 0},                                               // continuation missing
  };
  for (const auto& [text, want] : cases) EXPECT_EQ(first_invalid_utf8(text), want) << text;
}

TEST(BpeTokenizer, RefusesWhatItCannotHandle) {
  test::TempDir d;
  const std::string p =
      test::write_file(d, "tokenizer.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  try {
    BpeTokenizer::load(p);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("model type \"Unigram\" is not supported"),
              std::string::npos)
        << e.what();
  }
  test::write_file(d, "broken.json", "{not json");
  EXPECT_THROW(BpeTokenizer::load(d.str() + "/broken.json"), std::invalid_argument);
}

// Found by fuzz/fuzz_tokenizer: a BPE model without a vocab object (read
// through a missing key: undefined behaviour), ids that would size the token
// table past memory or index before it, values of the wrong JSON type — each
// refused with the file named, before anything is sized by it.
TEST(BpeTokenizer, RefusesDamagedFilesBeforeSizingAnything) {
  test::TempDir d;
  const char* bpe = R"("type": "BPE", "merges": [])";
  for (const std::string& body :
       {std::string(R"({"model": {)") + bpe + "}}",
        std::string(R"({"model": {)") + bpe + R"(, "vocab": {"a": 4611686018427387904}}})",
        std::string(R"({"model": {)") + bpe + R"(, "vocab": {"a": -3}}})",
        std::string(R"({"model": {)") + bpe + R"(, "vocab": {"a": "zero"}}})",
        std::string(R"({"model": {)") + bpe + R"(, "vocab": {"a": 3.3e85}}})",
        std::string(R"({"model": {"type": "BPE", "vocab": {}, "merges": 7}})"),
        std::string(R"({"model": {)") + bpe +
            R"(, "vocab": {}}, "added_tokens": [{"id": 99999999999, "content": "x"}]})"}) {
    const std::string p = test::write_file(d, "tokenizer.json", body);
    try {
      BpeTokenizer::load(p);
      ADD_FAILURE() << "loaded: " << body;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tightfit
