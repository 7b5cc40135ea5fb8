// The run's data once set up: the tokenizer, the batches, and this rank's
// rows of each global batch.
#pragma once

#include <stdexcept>
#include <string>

#include "data_setup.hpp"
#include "run_environment.hpp"

namespace tightfit {

class TrainingData {
 public:
  explicit TrainingData(const RunEnvironment& env) : env_(env) {}
  TrainingData(const TrainingData&) = delete;
  TrainingData& operator=(const TrainingData&) = delete;

  void set(DataSetup setup) { setup_ = std::move(setup); }
  Tokenizer& tokenizer() { return *setup_.tokenizer; }
  // False when the session was built without data (skip_data, dry runs).
  bool has_batches() const { return setup_.batcher != nullptr; }
  Batcher& batcher() {
    if (!setup_.batcher) throw std::logic_error("this session was built without data");
    return *setup_.batcher;
  }
  // This rank's rows of the next global batch (batch_size each; world_size
  // times that in all, the same rows a single process with the whole batch sees).
  Batcher::Batch next_batch();
  double unigram_entropy() const { return setup_.unigram_entropy; }
  // The batches hold preference pairs (Batcher::Batch::pairs).
  bool pairs() const { return setup_.pairs; }
  // The batches hold prompts alone (Batcher::Batch::prompts).
  bool prompts() const { return setup_.prompts; }
  // Their longest, in tokens as the model reads them (0 for other data).
  int64_t longest_prompt() const { return setup_.longest_prompt; }
  // Instruction/chat examples and what became of them; "" for a text corpus.
  const std::string& description() const { return setup_.description; }

 private:
  const RunEnvironment& env_;
  DataSetup setup_;
};

}  // namespace tightfit
