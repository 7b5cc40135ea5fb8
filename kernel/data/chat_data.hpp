// Instruction and chat data: rows (JSONL) -> the model's chat template ->
// token ids with a loss mask (the answers only, by default) -> examples.
//
// Row forms, as TRL's SFTTrainer takes them:
//   {"messages": [{"role", "content"}, ...], "tools"?}   a conversation
//   {"prompt": "...", "completion": "..."}               plain prompt/completion
//   {"prompt": [messages], "completion": [messages]}     conversational
//   {"instruction", "input"?, "output"}                  Alpaca
//   {"text": "..."}                                      plain language modelling
// Masks: prompt/completion rows as TRL's completion_only_loss; conversations
// by the template's {% generation %} marks (transformers'
// return_assistant_tokens_mask) or, without marks, every token an assistant
// turn adds after the prompt for it (the generation prompt included in the
// prompt), found from a few renderings whatever the number of turns.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "chat_template.hpp"
#include "data.hpp"
#include "jsonl_rows.hpp"
#include "tokenizer_config.hpp"

namespace tightfit {

enum class TrainOn { kCompletion, kAll };

// One example: ids[i] is trained on (a target of the loss) when trained[i].
struct Example {
  std::vector<int64_t> ids;
  std::vector<uint8_t> trained;
  // A prompt/completion row whose tokenized prompt is not a prefix of its
  // tokenized prompt + completion (a merge across the boundary): masked as
  // TRL masks it, the first len(prompt ids) tokens, and counted.
  bool prompt_not_prefix = false;
  // An unpaired preference row's label (KTO): 1 desirable, 0 not; -1 for
  // every other example.
  int8_t desirable = -1;
};

class ChatFormatter {
 public:
  ChatFormatter(const Tokenizer& tokenizer, TokenizerConfig config, TrainOn train_on);
  ~ChatFormatter();
  // Throws std::invalid_argument naming `where` (file:line) and the field.
  Example format(const nlohmann::ordered_json& row, const std::string& where) const;
  const TokenizerConfig& config() const { return config_; }
  // How many times the chat template has been rendered: a conversation
  // takes a few renderings whatever its number of turns.
  int64_t renders() const { return renders_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  // The template rendered over `messages` (refused, naming `where`, when the
  // tokenizer has none or the template fails on them).
  ChatRender render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                    const nlohmann::ordered_json& tools, const std::string& where) const;

 private:
  Example format_row(const nlohmann::ordered_json& row, const std::string& where) const;
  Example conversation(const nlohmann::ordered_json& row, const std::string& where) const;
  std::vector<std::pair<size_t, size_t>> assistant_spans(const nlohmann::ordered_json& messages,
                                                         const nlohmann::ordered_json& tools,
                                                         const ChatRender& full,
                                                         const std::string& where) const;
  Example prompt_completion(const std::string& prompt, const std::string& completion) const;
  Example chat_prompt_completion(const nlohmann::ordered_json& prompt,
                                 const nlohmann::ordered_json& completion,
                                 const nlohmann::ordered_json& tools,
                                 const std::string& where) const;
  const ChatTemplate& chat_template(const std::string& where) const;

  const Tokenizer& tokenizer_;
  TokenizerConfig config_;
  TrainOn train_on_;
  std::unique_ptr<ChatTemplate> template_;
  mutable int64_t renders_ = 0;
};

// transformers' continue_final_message: `rendered` (the conversation
// without a generation prompt) cut right after its last message's
// `content`, so that the model continues it. Throws std::invalid_argument
// naming `where` when the template does not write the content as it is.
std::string continue_final_message(const std::string& rendered, const std::string& content,
                                   const std::string& where);

// Checks a list of messages: objects with a string role and string content
// (or, unless `content_required`, none or null). Throws std::invalid_argument
// naming `where` and "field"[k].
void check_chat_messages(const nlohmann::ordered_json& messages, const std::string& where,
                         const char* field, bool content_required = false);

// 1 for each token of `ids` (the encoding of `text`) that holds a byte of one
// of the [begin, end) `spans`, as transformers maps characters to tokens.
std::vector<uint8_t> span_token_mask(const Tokenizer& tokenizer, const std::string& text,
                                     const std::vector<int64_t>& ids,
                                     const std::vector<std::pair<size_t, size_t>>& spans);

// Reads JSONL rows from a file or a folder of .jsonl files (sorted, recursive)
// and formats each. Throws std::invalid_argument naming file:line, and
// DataOutOfMemory naming file:line and the stage when memory runs out.
std::vector<Example> load_examples(const std::string& spec, const ChatFormatter& formatter,
                                   const std::string& base_dir = {});

}  // namespace tightfit
