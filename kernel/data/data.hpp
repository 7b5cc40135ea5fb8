// Data: text corpora, tokenized, into fixed-length batches, deterministic
// by seed and position (so a resumed run sees the same batches).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer.hpp"
#include "utf8.hpp"

namespace tightfit {

// Reads a corpus: "builtin:fortunes" (Debian's fortunes package), a text file,
// a folder of text files (sorted, recursive) or a JSONL file with a "text"
// field. Throws std::runtime_error naming the path and the fix.
std::string load_corpus_text(const std::string& spec, const std::string& base_dir = {});

// The bytes on disk of what load_corpus_text would read (the sum of a
// folder's files), found without reading any; 0 when it cannot tell.
int64_t corpus_bytes_on_disk(const std::string& spec, const std::string& base_dir = {});

// Shannon entropy (nats/token) of the unigram distribution: the loss a model
// that ignores context cannot beat.
double unigram_entropy(const at::Tensor& tokens, int64_t vocab);

// Batches for training and validation, deterministic in (seed, position).
class Batcher {
 public:
  virtual ~Batcher() = default;
  struct Batch {
    at::Tensor tokens;   // int64 [B, T]
    at::Tensor targets;  // int64 [B, T], the next tokens; kIgnoreIndex where not trained
    // int64 [B, T] when rows are packed with several examples: each token's
    // position in its example (restarting at 0). Undefined: 0..T-1 per row.
    at::Tensor positions;
    // Preference pairs: rows [0, pairs) are the chosen sides, rows
    // [pairs, 2 pairs) the rejected ones in the same order; 0 otherwise.
    int64_t pairs = 0;
    // Unpaired preference rows (KTO): int64 [pairs], 1 where row r's
    // completion is desirable, 0 where not; rows [pairs, 2 pairs) are the
    // KL rows. Undefined otherwise.
    at::Tensor desirable;
    // Preference batches: int64 [pairs], each pair's index among the run's
    // preference rows (the training ones as stored, then the held-out ones).
    at::Tensor row_ids;
    // int64 [B, T], 1 where the token is an example's and 0 where it pads
    // its row (transformers' attention_mask); undefined when none pads.
    at::Tensor attention_mask;
    // Preference batches: int64 [B], 1 where the row's first token is its
    // answer's (no prompt token precedes it); undefined otherwise.
    at::Tensor answer_first;
    // Prompts alone (PromptBatcher): this many rows, each one prompt's ids
    // padded after, row_ids set, no target; 0 otherwise.
    int64_t prompts = 0;
  };
  // The batch at the current position; advances the position.
  virtual Batch next() = 0;
  // Validation batch i (fixed, independent of position).
  virtual Batch validation(int64_t i) const = 0;
  // Preference rows with row_ids [first, first + count), at most up to the
  // end of their split (pairs 0 past the last). Other batchers have none.
  virtual Batch preference_rows(int64_t /*first*/, int64_t /*count*/) const {
    throw std::invalid_argument("the data holds no preference rows");
  }
  int64_t position() const { return position_; }
  void set_position(int64_t p) { position_ = p; }

 protected:
  int64_t position_ = 0;
};

// Token stream split into train and validation parts, sampled into batches.
class TokenBatcher final : public Batcher {
 public:
  TokenBatcher(at::Tensor tokens, int64_t seq_len, int64_t batch_size, uint64_t seed,
               double val_fraction);

  Batch next() override;
  Batch validation(int64_t i) const override;
  int64_t train_tokens() const { return train_.numel(); }
  const at::Tensor& train_split() const { return train_; }

 private:
  Batch sample(const at::Tensor& split, uint64_t stream_seed) const;
  at::Tensor train_, val_;
  int64_t seq_len_, batch_size_;
  uint64_t seed_;
};

}  // namespace tightfit
