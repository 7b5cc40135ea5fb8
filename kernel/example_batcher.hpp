// Instruction and chat examples into batches (packing = false): one example
// per row, right-padded to seq_len, its targets kIgnoreIndex wherever the
// example is not trained on (the prompt, by default) and on the padding. An
// example longer than seq_len + 1 tokens is cut there and counted. Whole
// examples are held out for validation, chosen by the seed; training walks
// the rest in a new seeded order each epoch.
#pragma once

#include <cstdint>
#include <vector>

#include "chat_data.hpp"
#include "data.hpp"

namespace tightfit {

class ExampleBatcher final : public Batcher {
 public:
  ExampleBatcher(std::vector<Example> examples, int64_t seq_len, int64_t batch_size, uint64_t seed,
                 double val_fraction, int64_t pad_id);

  Batch next() override;
  Batch validation(int64_t i) const override;

  struct Counts {
    int64_t examples = 0, train = 0, validation = 0;
    int64_t truncated = 0;       // longer than seq_len + 1 tokens: cut
    int64_t without_answer = 0;  // no trained token within seq_len: left out
    int64_t trained_tokens = 0;  // targets trained on, over the training split
  };
  const Counts& counts() const { return counts_; }
  // All ids of the training split, for the corpus statistics.
  at::Tensor train_ids() const;

 private:
  Batch rows(const std::vector<const Example*>& examples) const;
  std::vector<Example> train_, val_;
  int64_t seq_len_, batch_size_, pad_id_;
  uint64_t seed_;
  Counts counts_;
  mutable int64_t order_epoch_ = -1;
  mutable std::vector<size_t> order_;
};

}  // namespace tightfit
