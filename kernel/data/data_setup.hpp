// A recipe's [data] made real: the tokenizer, and the batches it trains on —
// a text corpus as one token stream, or instruction/chat rows (JSONL) as
// examples through the model's chat template with the answers-only loss.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data.hpp"
#include "preference_data.hpp"

namespace tightfit {

struct DataRequest {
  std::string corpus, tokenizer, base_dir;
  std::string weights;        // [model].weights (file or folder), "" when none
  std::string chat_template;  // a .jinja file that replaces the tokenizer's, "" when none
  std::string train_on = "completion";
  bool packing = false;
  PreferenceOptions preference;  // max_length 0: seq_len + 1
  // The preference keys the recipe sets ([data] max_prompt_length, ...):
  // refused, by name, for data that holds no preference pairs.
  std::vector<std::string> preference_keys_set;
  int64_t seq_len = 0, batch_size = 0, world_size = 1;
  double val_fraction = 0;
  uint64_t seed = 0;
  int64_t memory_budget = 0;       // named in the message when the data alone is over it
  bool budget_counts_host = true;  // false on a GPU, whose budget is the device's
  bool read_data = true;           // false: the tokenizer only
  // The schedule completes prompts itself (TF_SCHEDULE_FEATURE_PROMPTS):
  // the corpus must hold prompt rows, batched as prompts (prompt_data.hpp).
  bool prompts = false;
};

struct DataSetup {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_spec;  // "byte" or the tokenizer.json used
  std::unique_ptr<Batcher> batcher;
  double unigram_entropy = 0;
  std::string description;     // examples and what became of them; "" for a text corpus
  bool pairs = false;          // the batches hold preference pairs (Batcher::Batch::pairs)
  bool unpaired = false;       // ... unpaired rows and their KL rows (Batch::desirable)
  bool prompts = false;        // ... prompts alone (Batch::prompts, PromptBatcher)
  int64_t longest_prompt = 0;  // prompts: the longest, in tokens (read for a plan too)
};

// Throws std::invalid_argument or std::runtime_error naming the file, line
// and field, and OutOfBudgetError when the data alone is over the budget.
DataSetup setup_data(const DataRequest& request);

// What `spec` holds, told by its first JSONL row: plain text; rows of
// instruction or chat data (messages, prompt/completion, instruction/output);
// preference pairs (chosen and rejected); or unpaired preference rows
// (completion and label, KTO's); or prompts alone ("prompt" and no answer:
// online RL's).
enum class CorpusKind { kText, kExamples, kPairs, kUnpaired, kPrompts };
CorpusKind corpus_kind(const std::string& spec, const std::string& base_dir);

}  // namespace tightfit
