// A Hugging Face tokenizer.json with a BPE model, run as the tokenizers
// library runs it:
//   added tokens that are not normalized are split out of the raw text;
//   each remaining segment is normalized (NFC/NFKC, Prepend, Replace, ...);
//   normalized added tokens are split out of it;
//   the pre-tokenizer cuts pieces (regex Split, ByteLevel, Metaspace);
//   the BPE model encodes each piece (byte-level or SentencePiece-style with
//   byte fallback); the post-processor adds BOS/EOS when asked.
// That covers GPT-2, LLaMA 2 and 3, Mistral, TinyLlama, Qwen2 and Qwen3.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "added_token_matcher.hpp"
#include "bpe_model.hpp"
#include "tokenizer.hpp"
#include "tokenizer_steps.hpp"

namespace tightfit {

class BpeTokenizer final : public Tokenizer {
 public:
  // `path`: a tokenizer.json, or a model folder whose tokenizer files
  // (tokenizer_folder.hpp) are read as transformers' AutoTokenizer reads them. Throws
  // std::invalid_argument naming the file and what it cannot handle.
  static std::unique_ptr<BpeTokenizer> load(const std::string& path);
  ~BpeTokenizer() override;

  int64_t vocab_size() const override { return vocab_size_; }
  // Without the post-processor's special tokens (as corpora are encoded).
  std::vector<int64_t> encode(const std::string& text) const override {
    return encode(text, false);
  }
  // `add_special_tokens`: the post-processor's BOS/EOS around the text, as
  // tokenizers' Tokenizer.encode(text) does by default.
  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const;
  std::vector<int64_t> encode_with_offsets(
      const std::string& text, std::vector<std::pair<size_t, size_t>>& offsets) const override;
  std::vector<int64_t> encode_with_special_tokens(const std::string& text) const override {
    return encode(text, true);
  }
  int64_t token_id(const std::string& token) const override {
    return token_to_id(token).value_or(-1);
  }
  std::string decode(const std::vector<int64_t>& ids) const override { return decode(ids, false); }
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const;
  std::string decode_skipping_special(const std::vector<int64_t>& ids) const override {
    return decode(ids, true);
  }
  std::string source_file() const override { return source_; }
  // The id of a token (added tokens included), as token_to_id does.
  std::optional<int64_t> token_to_id(const std::string& token) const;

 private:
  BpeTokenizer(const nlohmann::json& j, const std::string& source);
  struct AddedToken {
    std::string content;
    int64_t id = 0;
    bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
  };
  // Splits `text` at the added tokens of one kind (normalized or not):
  // [begin, end) runs of text go to on_text(begin, end), tokens to
  // on_token(id, begin, end).
  template <typename OnText, typename OnToken>
  void split_added(const std::string& text, bool normalized, OnText&& on_text,
                   OnToken&& on_token) const;
  // `offsets`: null, or where to append each token's bytes of the input.
  void encode_impl(const std::string& text, std::vector<int64_t>& out,
                   std::vector<std::pair<size_t, size_t>>* offsets) const;

  std::string source_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  BpeModel model_;
  Decoder decoder_;
  std::vector<AddedToken> added_;  // longest first
  // The added tokens of each kind (not normalized, normalized), found in one
  // pass: matcher index k is added_[added_of_kind_[kind][k]].
  std::unique_ptr<AddedTokenMatcher> added_matcher_[2];
  std::vector<size_t> added_of_kind_[2];
  std::vector<int64_t> prefix_ids_, suffix_ids_;  // the post-processor's, single sequence
  int64_t vocab_size_ = 0;
  std::vector<const AddedToken*> added_by_id_;
};

}  // namespace tightfit
