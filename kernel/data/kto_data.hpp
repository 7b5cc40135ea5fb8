// Unpaired preference rows (JSONL) -> completions and KL rows, as TRL 0.24's
// KTOTrainer prepares them:
//   rows      {"prompt", "completion", "label": true|false} (text or
//             messages), or preference pairs unpaired as TRL's
//             unpair_preference_dataset does (in blocks of 1000 rows: every
//             chosen answer labelled true, then every rejected one false);
//   texts     maybe_extract_prompt and maybe_apply_chat_template, one
//             completion at a time;
//   tokens    _tokenize (prompt + completion tokenized together, split
//             where the prompt's own tokens end) and _process_tokens (BOS
//             and EOS budgeted out of max_length, the prompt cut to
//             max_prompt_length, then the answer, BOS and EOS added);
//   KL rows   _get_kl_dataset: in each chunk of batch_size rows, row i's
//             prompt with row i-1's answer (the first takes the last's),
//             processed again. Rows are trained in their file order (TRL's
//             SequentialSampler), so a batch is a chunk.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_data.hpp"
#include "preference_data.hpp"

namespace tightfit {

// One unpaired row: its completion as trained (the prompt's tokens not
// targeted) and what its chunk's KL rows take from it.
struct KtoRow {
  Example completion;           // desirable set: 1 or 0
  std::vector<int64_t> prompt;  // after _process_tokens: cut, BOS first
  std::vector<int64_t> answer;  // after _tokenize, before any cut
  std::string where;            // file:line, for a KL row's errors
};

// Whether a row is an unpaired preference row ("completion" and "label").
bool is_unpaired_preference_row(const nlohmann::ordered_json& row);

class KtoFormatter {
 public:
  // `chat` renders conversations; options as TRL's KTOConfig
  // (max_completion_length is not read for a decoder, as in TRL).
  KtoFormatter(const ChatFormatter& chat, PreferenceOptions options);
  // One unpaired row (prompt, completion, label); throws
  // std::invalid_argument naming `where` (file:line) and the field.
  KtoRow format(const nlohmann::ordered_json& row, const std::string& where) const;
  // _process_tokens of a (processed) prompt and an answer: the sequence
  // with the prompt's tokens untrained, its prompt returned in `prompt_out`.
  Example process(std::vector<int64_t> prompt, std::vector<int64_t> answer,
                  const std::string& where, std::vector<int64_t>* prompt_out = nullptr) const;
  const PreferenceOptions& options() const { return options_; }

 private:
  const ChatFormatter& chat_;
  PreferenceOptions options_;
  int64_t eos_id_ = -1;
  int64_t bos_id_ = -1;  // -1: the tokenizer names none
};

// Reads every row of `spec` (unpaired rows, or pairs unpaired) in TRL's
// order.
std::vector<KtoRow> load_kto_rows(const std::string& spec, const KtoFormatter& formatter,
                                  const std::string& base_dir = {});

// The rows as the batcher takes them, two examples each (a unit): the
// row's completion, then its KL row, built within chunks of `chunk` rows
// of `rows` in their order (TRL's _get_kl_dataset with batch_size =
// per_device_train_batch_size).
std::vector<Example> kto_units(const std::vector<const KtoRow*>& rows, int64_t chunk,
                               const KtoFormatter& formatter);

}  // namespace tightfit
