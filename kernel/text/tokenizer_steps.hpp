// The parts of a Hugging Face tokenizer.json around its model: the
// normalizer, the pre-tokenizer and the decoder, each a list of steps
// (a "Sequence" flattened), applied as the tokenizers library applies them.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "pcre_regex.hpp"

namespace tightfit {

// GPT-2's reversible map of bytes to printable code points (ByteLevel).
struct ByteLevelAlphabet {
  ByteLevelAlphabet();
  std::string byte_to_char[256];
  int16_t byte_of_code_point[324];  // the inverse; -1 outside the alphabet
  // Appends the bytes `symbols` (a string of mapped code points) stand for;
  // a code point outside the alphabet is copied as it is.
  void decode(const std::string& symbols, std::string& out) const;
  std::string encode(const std::string& bytes) const;
};

// Text on its way to the model. `at_start`: it begins at byte 0 of the
// original input (Metaspace's prepend_scheme "first" looks at this). When
// offsets are tracked, `begin[i]`, `end[i]` are the bytes of the original
// input that byte i of `text` came from (a replacement or a prepended marker
// maps to the bytes it stands for), as the tokenizers library aligns
// normalized strings; untracked, both are empty.
struct Piece {
  std::string text;
  bool at_start = false;
  std::vector<uint32_t> begin, end;

  bool tracked() const { return !begin.empty() || text.empty(); }
  // A piece of `text` whose bytes come from original bytes offset, offset + 1, ...
  static Piece tracked_from(std::string text, uint32_t offset, bool at_start);
  Piece slice(size_t b, size_t e) const;
};

// Text before the model sees it: Unicode normal forms, Prepend, Replace,
// Strip, Lowercase.
class Normalizer {
 public:
  // `spec` is the tokenizer.json "normalizer" value (null: none).
  Normalizer(const nlohmann::json& spec, const std::string& source);
  ~Normalizer();
  // Normalizing is bounded: the text may grow to kMaxGrowth x its size +
  // kSlackBytes (real normalizers stay within 11x: NFKD of U+FDFA), checked
  // before a Replace builds it; past that, std::runtime_error naming the
  // file and the step.
  static constexpr size_t kMaxGrowth = 16;
  static constexpr size_t kSlackBytes = 1024;
  std::string apply(const std::string& text) const;
  void apply(Piece& piece) const;  // keeps the piece's offsets when tracked
  bool empty() const { return steps_.empty(); }

 private:
  struct Step;
  std::vector<std::unique_ptr<Step>> steps_;
  std::string source_;
};

// Splits normalized text into the pieces the model encodes one by one:
// Split (regex or string), ByteLevel, Metaspace, Digits.
class PreTokenizer {
 public:
  PreTokenizer(const nlohmann::json& spec, const std::string& source);
  ~PreTokenizer();
  void apply(std::vector<Piece>& pieces) const;
  // Whether pieces come out in the byte-level alphabet (a ByteLevel step).
  bool byte_level() const { return byte_level_; }

 private:
  struct Step;
  std::vector<std::unique_ptr<Step>> steps_;
  bool byte_level_ = false;
  std::string source_;
};

// Turns token strings back into text: ByteLevel, Metaspace, Replace,
// ByteFallback, Fuse, Strip. No decoder: tokens joined by spaces (as the
// library does).
class Decoder {
 public:
  Decoder(const nlohmann::json& spec, const std::string& source);
  ~Decoder();
  std::string apply(std::vector<std::string> tokens) const;

 private:
  struct Step;
  std::vector<std::unique_ptr<Step>> steps_;
  bool present_ = false;
};

}  // namespace tightfit
