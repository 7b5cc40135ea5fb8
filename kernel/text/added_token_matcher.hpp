// Finds a tokenizer's added tokens in a text in one pass, linear in the text
// whatever their number or length: an Aho-Corasick automaton over the tokens
// written backwards, run over the text backwards, gives for every position
// the longest token that starts there. The tokenizers library then takes
// matches leftmost-longest and non-overlapping (its AhoCorasick with
// MatchKind::LeftmostLongest); BpeTokenizer walks them the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tightfit {

class AddedTokenMatcher {
 public:
  // `tokens[k]` is token k's text (not empty).
  explicit AddedTokenMatcher(const std::vector<std::string>& tokens);

  // For each byte position of `text`, the index of the longest token that
  // starts there, or -1.
  std::vector<int32_t> longest_from(const std::string& text) const;
  bool empty() const { return lengths_.empty(); }

 private:
  struct State {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t fail = 0;
    int32_t token = -1;    // the token this state spells, if any
    int32_t longest = -1;  // the longest token that ends here: this or one down the fail chain
  };
  int32_t child(int32_t s, uint8_t c) const;

  std::vector<State> states_;
  std::vector<size_t> lengths_;
};

}  // namespace tightfit
