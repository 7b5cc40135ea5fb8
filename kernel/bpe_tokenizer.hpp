// Byte-level BPE from a Hugging Face tokenizer.json (GPT-2 and LLaMA-3 style):
// added tokens split out first, then the pre-tokenizer's regex (PCRE2, for
// \p{L}/\p{N} classes and look-ahead), bytes mapped to GPT-2's printable
// alphabet, merges applied by rank, ids from the vocabulary.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "data.hpp"

namespace tightfit {

class BpeTokenizer final : public Tokenizer {
 public:
  // `path`: a tokenizer.json, or a folder holding one. Throws
  // std::invalid_argument naming the file and what it cannot handle.
  static std::unique_ptr<BpeTokenizer> load(const std::string& path);
  ~BpeTokenizer() override;

  int64_t vocab_size() const override { return vocab_size_; }
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string source_file() const override { return source_; }

 private:
  BpeTokenizer() = default;
  static std::unique_ptr<BpeTokenizer> from_json(const nlohmann::json& j,
                                                 const std::filesystem::path& path,
                                                 const std::string& src);
  void encode_piece(const std::string& piece, std::vector<int64_t>& out) const;
  std::vector<std::string> pre_tokenize(const std::string& text) const;

  struct Regex;
  std::vector<std::unique_ptr<Regex>> splits_;  // applied in order, "isolated" behaviour
  std::string source_;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::map<std::pair<std::string, std::string>, int> merge_rank_;
  std::vector<std::pair<std::string, int64_t>> added_;  // content, id (longest first)
  std::vector<bool> is_added_;
  bool added_first_byte_[256] = {};  // bytes an added token can start with
  int64_t vocab_size_ = 0;
  std::string byte_to_unicode_[256];
  std::unordered_map<std::string, unsigned char> unicode_to_byte_;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;
};

}  // namespace tightfit
