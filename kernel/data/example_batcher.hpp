// Instruction and chat examples into batches: one example per row, right-
// padded to seq_len (packing = false), or several to a row (packing = true),
// placed best-fit decreasing as TRL's "bfd" packs, each with its own
// positions from 0 so that the model keeps attention inside it. Targets are
// kIgnoreIndex wherever the example is not trained on (the prompt, by
// default), on the padding and across a boundary (an example's last token
// predicts nothing). An example longer than seq_len + 1 tokens is cut there
// and counted. Whole examples are held out for validation, chosen by the
// seed; training walks the rows in a new seeded order each epoch.
//
// With `pairs`, examples come two by two (a preference pair: chosen, then
// rejected) and stay together: held out, shuffled and batched as pairs, a
// batch of batch_size pairs holding every chosen row, then every rejected
// row in the same order (Batch::pairs), padded to its longest row (as TRL's
// collator pads them) rather than to seq_len.
#pragma once

#include <cstdint>
#include <vector>

#include "chat_data.hpp"
#include "data.hpp"

namespace tightfit {

// A permutation of [0, n) drawn from `seed`, the same on every machine.
std::vector<size_t> seeded_permutation(size_t n, uint64_t seed);

class ExampleBatcher final : public Batcher {
 public:
  ExampleBatcher(std::vector<Example> examples, int64_t seq_len, int64_t batch_size, uint64_t seed,
                 double val_fraction, int64_t pad_id, bool packing = false, bool pairs = false);
  // Rows point into the splits it holds.
  ExampleBatcher(const ExampleBatcher&) = delete;
  ExampleBatcher& operator=(const ExampleBatcher&) = delete;

  // Units already split (two examples each: kto_units), batched in their
  // order (TRL's SequentialSampler): each epoch goes through the training
  // units once, its last batch shorter, or completed with the first units
  // when `fill_last` (accelerate's even_batches, for several processes).
  struct Splits {
    std::vector<Example> train, validation;
  };
  ExampleBatcher(Splits splits, int64_t seq_len, int64_t batch_size, int64_t pad_id,
                 bool fill_last);
  // Which of `units` the constructor above holds out for validation (the
  // same draw as the shuffling constructor's).
  static std::vector<bool> held_out(size_t units, double val_fraction, uint64_t seed);

  Batch next() override;
  Batch validation(int64_t i) const override;
  Batch preference_rows(int64_t first, int64_t count) const override;

  struct Counts {
    int64_t examples = 0, train = 0, validation = 0;  // pairs, with pairs
    int64_t truncated = 0;                            // longer than seq_len + 1 tokens: cut
    int64_t without_answer = 0;                       // no trained token within seq_len: left out
    int64_t trained_tokens = 0;                       // targets trained on, over the training split
    int64_t rows = 0;                                 // training rows (= train unless packed)
    double row_fill = 0;  // share of the training rows' tokens that are examples'
  };
  const Counts& counts() const { return counts_; }
  // All ids of the training split, for the corpus statistics.
  at::Tensor train_ids() const;

 private:
  using Row = std::vector<const Example*>;  // the examples of one row, in order
  std::vector<Row> make_rows(const std::vector<Example>& split) const;
  Batch batch_of(const std::vector<const Row*>& rows) const;
  // `id_offset`: the row_ids of `rows`' units start there (held-out units
  // follow the training ones).
  Batch units_batch(const std::vector<Row>& rows, const std::vector<size_t>& units,
                    int64_t id_offset) const;
  // Units of group_ examples, cut to seq_len + 1 (counted); a unit without
  // a trained token is dropped unless `keep_unanswered`.
  std::vector<std::vector<Example>> take_units(std::vector<Example>& examples,
                                               bool keep_unanswered);
  void finish();  // counts and rows of the splits
  std::vector<Example> train_, val_;
  std::vector<Row> train_rows_, val_rows_;
  int64_t seq_len_, batch_size_, pad_id_;
  int64_t group_;  // examples per unit: 1, or 2 for preference pairs
  bool packing_;
  uint64_t seed_;
  bool sequential_ = false, fill_last_ = false;
  Counts counts_;
  mutable int64_t order_epoch_ = -1;
  mutable std::vector<size_t> order_;
};

}  // namespace tightfit
