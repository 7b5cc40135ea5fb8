// A model's chat template (the Jinja text in tokenizer_config.json), rendered
// as transformers' apply_chat_template renders it: Jinja with trim_blocks and
// lstrip_blocks, loop controls, raise_exception, strftime_now, tojson and the
// {% generation %} tag that marks assistant output. What the host cannot
// evaluate is refused naming the construct and its place, never skipped.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "chat_render.hpp"

namespace tightfit {

class ChatTemplate {
 public:
  // Throws std::invalid_argument naming `origin`, the line and column, and
  // the construct, when the template does not parse or uses what is not
  // supported.
  ChatTemplate(const std::string& source, const std::string& origin);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;

  // `messages`: [{"role": ..., "content": ...}, ...]; `variables`: the rest
  // of the template's context (bos_token, eos_token, tools, ...). Throws
  // std::runtime_error when the template raises or fails on this input.
  ChatRender render(
      const nlohmann::ordered_json& messages, bool add_generation_prompt,
      const nlohmann::ordered_json& variables = nlohmann::ordered_json::object()) const;
  bool has_generation_blocks() const { return has_generation_; }
  const std::string& origin() const { return origin_; }

 private:
  struct Tree;
  std::unique_ptr<Tree> tree_;
  std::string origin_;
  bool has_generation_ = false;
};

}  // namespace tightfit
