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
// return_assistant_tokens_mask) or, without marks, by rendering each answer's
// prefix with the generation prompt: every token an assistant turn adds.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "chat_template.hpp"
#include "data.hpp"

namespace tightfit {

// The special tokens and chat template of a model folder, from its
// tokenizer_config.json (and chat_template.jinja, which wins, as in
// transformers). A folder without them gives an empty config.
struct TokenizerConfig {
  std::string bos_token, eos_token, pad_token, unk_token;  // empty when absent
  std::string chat_template;                               // Jinja text; empty when absent
  std::string source;                                      // the file, for messages
  // `path`: a model folder, or a tokenizer_config.json. Throws
  // std::invalid_argument naming the file when it is malformed.
  static TokenizerConfig load(const std::string& path);
  // The template's variables: bos_token, eos_token, pad_token, unk_token.
  nlohmann::ordered_json template_variables() const;
};

enum class TrainOn { kCompletion, kAll };

// One example: ids[i] is trained on (a target of the loss) when trained[i].
struct Example {
  std::vector<int64_t> ids;
  std::vector<uint8_t> trained;
};

class ChatFormatter {
 public:
  ChatFormatter(const Tokenizer& tokenizer, TokenizerConfig config, TrainOn train_on);
  ~ChatFormatter();
  // Throws std::invalid_argument naming `where` (file:line) and the field.
  Example format(const nlohmann::ordered_json& row, const std::string& where) const;
  const TokenizerConfig& config() const { return config_; }

 private:
  Example conversation(const nlohmann::ordered_json& row, const std::string& where) const;
  Example prompt_completion(const std::string& prompt, const std::string& completion) const;
  Example chat_prompt_completion(const nlohmann::ordered_json& prompt,
                                 const nlohmann::ordered_json& completion,
                                 const nlohmann::ordered_json& tools,
                                 const std::string& where) const;
  const ChatTemplate& chat_template(const std::string& where) const;
  ChatRender render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                    const nlohmann::ordered_json& tools, const std::string& where) const;

  const Tokenizer& tokenizer_;
  TokenizerConfig config_;
  TrainOn train_on_;
  std::unique_ptr<ChatTemplate> template_;
};

// 1 for each token of `ids` (the encoding of `text`) that holds a byte of one
// of the [begin, end) `spans`, as transformers maps characters to tokens.
std::vector<uint8_t> span_token_mask(const Tokenizer& tokenizer, const std::string& text,
                                     const std::vector<int64_t>& ids,
                                     const std::vector<std::pair<size_t, size_t>>& spans);

// Reads JSONL rows from a file or a folder of .jsonl files (sorted, recursive)
// and formats each. Throws std::invalid_argument naming file:line.
std::vector<Example> load_examples(const std::string& spec, const ChatFormatter& formatter,
                                   const std::string& base_dir = {});

}  // namespace tightfit
