// Preference rows (JSONL) -> prompt, chosen and rejected token ids, as TRL's
// DPOTrainer prepares them (maybe_extract_prompt, maybe_apply_chat_template,
// tokenize_row with add_special_tokens = False), then each side as the
// concatenated pass sees it: prompt + completion cut to max_length, the
// completion's tokens trained.
//
// Row forms (TRL's preference types):
//   {"prompt": "...", "chosen": "...", "rejected": "..."}        text
//   {"prompt": [msgs], "chosen": [msgs], "rejected": [msgs]}     conversational
//   {"chosen": ..., "rejected": ...}                             implicit prompt:
//       the shared start of chosen and rejected (messages, or characters)
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "chat_data.hpp"

namespace tightfit {

// TRL's DPOConfig names and defaults; 0 is None (no limit).
struct PreferenceOptions {
  int64_t max_prompt_length = 512;    // the prompt's last tokens are kept
  int64_t max_completion_length = 0;  // each completion's first tokens are kept
  int64_t max_length = 1024;          // prompt + completion
  bool keep_end = true;               // truncation_mode: "keep_end" or "keep_start"
  // Tokenized as TRL's CPOTrainer and ORPOTrainer do (a schedule's
  // preference_tokenization = "joint"): prompt + completion together, the
  // tokenizer's BOS before the prompt, their truncation; false: DPOTrainer's.
  bool joint = false;
  // Tokenized as TRL's KTOTrainer does (preference_tokenization = "kto"):
  // unpaired rows, or pairs unpaired, each with its KL row (kto_data.hpp).
  bool unpaired = false;
};

// TRL's prompt_input_ids, chosen_input_ids and rejected_input_ids (each
// completion ends with EOS). Tokenized jointly, each completion has its own
// prompt (the prompt's last token may merge into the completion's first):
// chosen_prompt and rejected_prompt; otherwise both equal `prompt`.
struct PreferencePair {
  std::vector<int64_t> prompt, chosen, rejected;
  std::vector<int64_t> chosen_prompt, rejected_prompt;
};

// prompt + completion cut to options.max_length as TRL's concatenated_forward
// cuts it (keep_end: the last max_length tokens; keep_start: the first);
// trained marks the completion's tokens.
Example preference_sequence(const std::vector<int64_t>& prompt,
                            const std::vector<int64_t>& completion,
                            const PreferenceOptions& options);

// Whether a row is a preference row ("chosen" and "rejected").
bool is_preference_row(const nlohmann::ordered_json& row);

// TRL's is_conversational for one field: a list whose first element is a
// message (an object with "role" and "content").
bool conversational(const nlohmann::ordered_json& v);

// The tokenizer's EOS and BOS ids (-1 where its config names none); a token
// the config names but the vocabulary lacks is refused, never dropped.
struct PreferenceSpecialTokens {
  explicit PreferenceSpecialTokens(const ChatFormatter& chat);
  int64_t eos = -1, bos = -1;
};

// The steps of a preference row that every TRL preference trainer shares
// (kto_data.hpp builds on them too).
//
// maybe_extract_prompt: the row's prompt, chosen and rejected (text or
// messages); the prompt is their shared start when the row has none of the
// answers' kind.
struct PreferenceSplit {
  nlohmann::ordered_json prompt, chosen, rejected;
};
PreferenceSplit split_preference_row(const nlohmann::ordered_json& row, const std::string& where);

// maybe_apply_chat_template: the prompt and each answer as text. Messages
// are rendered through `chat` (a prompt ending with "user" gets the
// generation prompt, one ending with "assistant" is continued), each answer
// the rest of prompt + answer after their shared characters.
struct PromptTexts {
  std::string prompt;
  std::vector<std::string> completions;
};
PromptTexts render_preference_texts(
    const ChatFormatter& chat, const nlohmann::ordered_json& prompt,
    const std::vector<std::pair<const nlohmann::ordered_json*, const char*>>& answers,
    const std::string& where);

// "tools", "chat_template_kwargs" and "images" in a row: refused by name.
void check_preference_row_keys(const nlohmann::ordered_json& row, const std::string& where);

// prompt + answer tokenized together and split where the prompt's own
// tokens (`alone`) end — one earlier when the prompt's last token merged
// with the answer's first (TRL's build_tokenized_answer and KTO's _tokenize).
struct JointSide {
  std::vector<int64_t> prompt, answer;
};
JointSide split_prompt_answer(const Tokenizer& tok, const std::string& prompt,
                              const std::vector<int64_t>& alone, const std::string& answer,
                              const std::string& where, const char* field);

class PreferenceFormatter {
 public:
  // `chat` renders conversations (its tokenizer and template).
  PreferenceFormatter(const ChatFormatter& chat, PreferenceOptions options);
  // Throws std::invalid_argument naming `where` (file:line) and the field.
  PreferencePair format(const nlohmann::ordered_json& row, const std::string& where) const;
  const PreferenceOptions& options() const { return options_; }

 private:
  // TRL's CPOTrainer/ORPOTrainer tokenize_row on the rendered texts.
  PreferencePair tokenize_jointly(const std::string& prompt, const std::string& chosen,
                                  const std::string& rejected, const std::string& where) const;

  const ChatFormatter& chat_;
  PreferenceOptions options_;
  int64_t eos_id_ = -1;
  int64_t bos_id_ = -1;  // -1: the tokenizer names none (no BOS is added)
};

// Reads preference rows as load_examples reads rows: each pair as two
// examples, chosen then rejected (preference_sequence of each).
std::vector<Example> load_preference_examples(const std::string& spec,
                                              const PreferenceFormatter& formatter,
                                              const std::string& base_dir = {});

}  // namespace tightfit
