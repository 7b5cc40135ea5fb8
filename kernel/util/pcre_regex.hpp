// A compiled PCRE2 pattern (UTF-8, Unicode properties, JIT) for the regexes a
// tokenizer.json carries: Oniguruma-style \p{L}/\p{N} classes and look-ahead,
// as the Hugging Face tokenizers library evaluates them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tightfit {

class Pcre2Regex {
 public:
  // `literal`: the pattern is a plain string to find, not a regex. Throws
  // std::invalid_argument naming `source` when the pattern does not compile.
  Pcre2Regex(const std::string& pattern, const std::string& source, bool literal = false);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // The [begin, end) byte ranges of the non-empty, non-overlapping matches,
  // left to right. Invalid UTF-8 never matches (it falls into the gaps).
  // Throws std::runtime_error naming the source and the pattern when PCRE2
  // gives up (its match, depth or heap limit: a pattern that backtracks
  // without end on this text), never taking that for "no more matches".
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  void* code_ = nullptr;     // pcre2_code*
  void* match_ = nullptr;    // pcre2_match_data*
  void* context_ = nullptr;  // pcre2_match_context*: the limits and the JIT stack
  void* stack_ = nullptr;    // pcre2_jit_stack*
  std::string source_, pattern_;
};

// Length of the UTF-8 sequence starting with byte c (1 for a stray byte).
inline size_t utf8_sequence_length(unsigned char c) {
  if (c >= 0xF0) return 4;
  if (c >= 0xE0) return 3;
  if (c >= 0xC0) return 2;
  return 1;
}

}  // namespace tightfit
