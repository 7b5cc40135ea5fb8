// The tokenizer pipeline is bounded on hostile tokenizer.json files: added
// tokens are found in one pass whatever their number, a regex that gives up
// is an error naming the file and the pattern (not "no more matches"), and a
// normalizer cannot inflate the text past a stated bound.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "bpe_tokenizer.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

using json = nlohmann::json;

// A tokenizer.json whose model knows "x" (id 0) and "y" (id 1), with the
// given extra parts.
std::string tokenizer_json(const json& extra) {
  json j = {
      {"model", {{"type", "BPE"}, {"vocab", {{"x", 0}, {"y", 1}}}, {"merges", json::array()}}}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j.dump();
}

// Encoding `text` fails with a message holding each of `phrases`.
void expect_encode_refused(const std::string& path, const std::string& text,
                           const std::vector<std::string>& phrases) {
  auto tok = BpeTokenizer::load(path);
  try {
    tok->encode(text);
    ADD_FAILURE() << "encoded " << text.size() << " bytes";
  } catch (const std::runtime_error& e) {
    for (const std::string& p : phrases)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n(" << p << ")";
  }
}

TEST(TokenizerBounds, TwentyThousandAddedTokensAreFoundInOnePass) {
  test::TempDir d;
  json added = json::array();
  const int n = 20000;
  auto name = [](int k) { return "<t" + std::to_string(k) + ">"; };
  for (int k = 0; k < n; ++k)
    added.push_back({{"id", 2 + k}, {"content", name(k)}, {"special", true}});
  // Overlapping texts, longest first wins: "<t1>" inside "<t12>" and "<t123>".
  const std::string path =
      test::write_file(d, "tokenizer.json", tokenizer_json({{"added_tokens", added}}));
  auto tok = BpeTokenizer::load(path);
  std::string text;
  std::vector<int64_t> want;
  for (int r = 0; r < 60000; ++r) {  // about 600 KB
    const int k = (r * 7919) % n;
    text += name(k) + "x";
    want.push_back(2 + k);
    want.push_back(0);
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(tok->encode(text), want);
  std::printf("  %zu bytes with %d added tokens encoded in %.3f s\n", text.size(), n,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

TEST(TokenizerBounds, ARegexThatGivesUpIsAnErrorNamingItsPattern) {
  test::TempDir d;
  const json split = {{"type", "Split"},
                      {"pattern", {{"Regex", "(x+x+)+y"}}},
                      {"behavior", "Isolated"},
                      {"invert", false}};
  const std::string path =
      test::write_file(d, "tokenizer.json", tokenizer_json({{"pre_tokenizer", split}}));
  // Fine where it matches at once; catastrophic backtracking where it cannot.
  EXPECT_EQ(BpeTokenizer::load(path)->encode("xxy"), (std::vector<int64_t>{0, 0, 1}));
  // A "y" at the end keeps PCRE2 from ruling the match out before it tries.
  expect_encode_refused(path, std::string(5000, 'x') + "zy", {path, "(x+x+)+y", "gave up"});
}

TEST(TokenizerBounds, NormalizersCannotInflateTheText) {
  test::TempDir d;
  auto replace = [](const std::string& from, const std::string& to) {
    return json{{"type", "Replace"}, {"pattern", {{"String", from}}}, {"content", to}};
  };
  // One step: each "x" becomes a megabyte.
  std::string path = test::write_file(
      d, "one.json", tokenizer_json({{"normalizer", replace("x", std::string(1 << 20, 'y'))}}));
  expect_encode_refused(path, "xxxx", {path, "normalizer step Replace", "16 x the text"});
  // Steps that each grow it 10 times.
  json steps = json::array();
  for (int k = 0; k < 6; ++k) steps.push_back(replace("y", "yyyyyyyyyy"));
  path = test::write_file(
      d, "many.json",
      tokenizer_json({{"normalizer", {{"type", "Sequence"}, {"normalizers", steps}}}}));
  expect_encode_refused(path, std::string(1000, 'y'), {path, "normalizer step", "inflates"});
  // What real normalizers do (Llama 2's Prepend and Replace) stays within it.
  json llama2 = json::array({{{"type", "Prepend"}, {"prepend", "y"}}, replace(" ", "yyy")});
  path = test::write_file(
      d, "real.json",
      tokenizer_json({{"normalizer", {{"type", "Sequence"}, {"normalizers", llama2}}}}));
  EXPECT_EQ(BpeTokenizer::load(path)->encode("x x").size(), 6u);  // "yxyyyx"
  // Metaspace's replacement comes from the file as well (a megabyte one is
  // refused at load: PCRE2 will not compile it).
  const json meta = {{"type", "Metaspace"},
                     {"replacement", std::string(30000, 'y')},
                     {"prepend_scheme", "never"},
                     {"split", false}};
  path = test::write_file(d, "meta.json", tokenizer_json({{"pre_tokenizer", meta}}));
  std::string spaced;
  for (int k = 0; k < 1000; ++k) spaced += "x ";
  expect_encode_refused(path, spaced, {path, "Metaspace", "inflates"});
}

}  // namespace
}  // namespace tightfit
