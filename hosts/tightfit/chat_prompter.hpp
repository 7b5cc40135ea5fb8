// Prompts for a model, in its chat template when it has one: `generate
// --chat/--prompts` and a run's answers before and after training
// ([run] answer_prompts) read them the same way.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_template.hpp"
#include "session.hpp"
#include "tokenizer_config.hpp"

namespace tightfit::host {

// A prompt to answer: its text, what to show for it, where to stop, and
// whether a chat template rendered it (then it holds its own special tokens).
struct Prompt {
  std::string text;
  std::string shown;  // the user's message, or the text
  std::vector<int64_t> stop_ids;
  bool rendered = false;
};

class ChatPrompter {
 public:
  explicit ChatPrompter(Session& session);
  // The tokenizer's EOS and generation_config.json's eos_token_id (one or a list).
  std::vector<int64_t> eos_ids() const;
  // Throws std::invalid_argument when the model has no chat template.
  std::string render(const nlohmann::ordered_json& messages) const;
  std::string render_user(const std::string& message) const;
  // Each line of `file`: plain text (continued as it is), or a JSONL row with
  // "messages" or "prompt" (rendered with the chat template when there is one).
  std::vector<Prompt> prompts_in(const std::string& file) const;

 private:
  const Tokenizer& tokenizer_;
  TokenizerConfig config_;
  std::unique_ptr<ChatTemplate> template_;
};

// Greedy answers (at most `tokens` tokens, stopping at the prompt's EOS).
std::string answer_greedily(Session& session, const Prompt& p, int64_t tokens);

}  // namespace tightfit::host
