// A model folder's tokenizer_config.json (and chat_template.jinja, which
// wins, as in transformers): the special tokens, the chat template, and the
// keys with which transformers' tokenizer classes change what tokenizer(text)
// adds (add_bos_token, add_eos_token, legacy, add_prefix_space).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tightfit {

// An added token as tokenizer_config.json's added_tokens_decoder (or a
// special token given as an object) writes it.
struct AddedTokenSpec {
  int64_t id = -1;  // -1: not given (a special token named by its text)
  std::string content;
  bool special = true, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

struct TokenizerConfig {
  std::string bos_token, eos_token, pad_token, unk_token;  // empty when absent
  std::string chat_template;                               // Jinja text; empty when absent
  std::string source;                                      // the file, for messages
  // The tokenizer class transformers' AutoTokenizer would build, without
  // "Fast" ("LlamaTokenizer", "Qwen2Tokenizer", ...): tokenizer_config.json's
  // tokenizer_class, else the one config.json's model_type maps to; "" when
  // neither names one. Its defaults fill the special tokens the file leaves out.
  std::string tokenizer_class;
  std::string class_source;  // where tokenizer_class came from, for messages
  std::optional<bool> add_bos_token, add_eos_token, legacy, add_prefix_space;
  // truncation_side = "left": a cut (tokenizer(..., truncation=True)) keeps
  // the last tokens; "right" (transformers' default) the first.
  bool truncate_left = false;
  std::vector<AddedTokenSpec> added_tokens_decoder;  // sorted by id
  // bos/eos/unk/pad and additional_special_tokens, with their flags.
  std::vector<AddedTokenSpec> special_tokens;
  // `path`: a model folder, or a tokenizer_config.json. Throws
  // std::invalid_argument naming the file when it is malformed. A folder
  // without one gives an empty config.
  static TokenizerConfig load(const std::string& path);
  // The template's variables: bos_token, eos_token, pad_token, unk_token.
  nlohmann::ordered_json template_variables() const;
};

}  // namespace tightfit
