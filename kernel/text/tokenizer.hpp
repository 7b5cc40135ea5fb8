// What a tokenizer does for tightfit (the interface every tokenizer
// implements), and the 256-id byte tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tightfit {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int64_t vocab_size() const = 0;
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // With the tokenizer's own BOS/EOS (its post-processor), as tokenizer(text)
  // in transformers; the byte tokenizer has none.
  virtual std::vector<int64_t> encode_with_special_tokens(const std::string& text) const {
    return encode(text);
  }
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // As decode, its special tokens left out (batch_decode(ids,
  // skip_special_tokens=True) in transformers); the byte tokenizer has none.
  virtual std::string decode_skipping_special(const std::vector<int64_t>& ids) const {
    return decode(ids);
  }
  // Token ids with the [begin, end) bytes of `text` each came from (no
  // special tokens added), as a fast tokenizer's offsets.
  virtual std::vector<int64_t> encode_with_offsets(
      const std::string& text, std::vector<std::pair<size_t, size_t>>& offsets) const = 0;
  // The id of a token spelled `token` (special tokens included), or -1.
  virtual int64_t token_id(const std::string& token) const {
    (void)token;
    return -1;
  }
  // The tokenizer.json it was read from; empty for built-in tokenizers.
  virtual std::string source_file() const { return {}; }
};

// Every byte is a token: vocabulary 256, nothing to download, lossless.
class ByteTokenizer final : public Tokenizer {
 public:
  int64_t vocab_size() const override { return 256; }
  std::vector<int64_t> encode(const std::string& text) const override;
  std::vector<int64_t> encode_with_offsets(
      const std::string& text, std::vector<std::pair<size_t, size_t>>& offsets) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
};

}  // namespace tightfit
