// Prompt rows for online RL (a schedule with TF_SCHEDULE_FEATURE_PROMPTS,
// GRPO), as TRL 0.24's GRPOTrainer reads them:
//   rows      {"prompt": text or messages, ...any other fields}: the other
//             fields go to the rewards with the row (TRL's reward kwargs);
//   text      maybe_apply_chat_template: messages through the chat template
//             with the generation prompt (or continuing a final assistant
//             message), text as it is;
//   tokens    tokenizer(text, add_special_tokens=False), cut to
//             max_prompt_length on the tokenizer's truncation_side.
// Batches hold batch_size prompts, padded after their ids; training walks
// the rows in a new seeded order each epoch; whole rows are held out.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_data.hpp"
#include "data.hpp"

namespace tightfit {

struct PromptRow {
  std::vector<int64_t> ids;  // as the model reads it (never empty)
  std::string text;          // the text it was tokenized from
  std::string row;           // the JSONL row as written (compact)
  std::string where;         // file:line, for messages
  bool truncated = false;    // cut to max_prompt_length
  // A prompt of messages ending with an assistant message, which the model
  // continues: that message's content, which TRL puts before each
  // completion's text for the rewards (its "bootstrap"); "" otherwise.
  std::string bootstrap;
};

// Whether a row is a prompt alone: a "prompt" and no answer of any kind.
bool is_prompt_only_row(const nlohmann::ordered_json& row);

// Every row of `spec`, formatted; max_prompt_length 0 = no cut. Throws
// std::invalid_argument naming file:line and the field.
std::vector<PromptRow> load_prompt_rows(const std::string& spec, const ChatFormatter& chat,
                                        int64_t max_prompt_length, bool truncate_left,
                                        const std::string& base_dir = {});

class PromptBatcher final : public Batcher {
 public:
  // `eos_id`, `pad_token_id`: the tokenizer's (-1 where it names none);
  // `pad_id` fills the rows (the pad token, else EOS, else 0).
  PromptBatcher(std::vector<PromptRow> rows, int64_t batch_size, uint64_t seed, double val_fraction,
                int64_t pad_id, int64_t eos_id = -1, int64_t pad_token_id = -1);
  Batch next() override;
  Batch validation(int64_t i) const override;
  // Row `id` of Batch::row_ids (training rows, then the held-out ones).
  const PromptRow& row(int64_t id) const;
  int64_t train_rows() const { return static_cast<int64_t>(train_.size()); }
  int64_t validation_rows() const { return static_cast<int64_t>(validation_.size()); }
  int64_t longest() const { return longest_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t pad_token_id() const { return pad_token_id_; }

 private:
  Batch batch_of(const std::vector<int64_t>& ids) const;
  std::vector<PromptRow> rows_;              // training rows first, then held-out ones
  std::vector<int64_t> train_, validation_;  // indices into rows_
  int64_t batch_size_, pad_id_, eos_id_, pad_token_id_, longest_ = 0;
  uint64_t seed_;
  int64_t order_epoch_ = -1;   // the epoch order_ was drawn for
  std::vector<size_t> order_;  // that epoch's order of train_
};

}  // namespace tightfit
