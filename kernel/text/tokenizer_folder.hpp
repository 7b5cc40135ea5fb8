// A model folder's tokenizer as transformers' AutoTokenizer builds its fast
// tokenizer, expressed as one tokenizer.json:
//   the files: tokenizer.json; else vocab.json + merges.txt (byte-level BPE,
//   converted as transformers' GPT2 and Qwen2 converters do); else
//   tokenizer.model (SentencePiece BPE, converted as its LlamaConverter does;
//   Unigram is refused by name); else a refusal naming the folder and the fix;
//   the class: tokenizer_config.json's tokenizer_class, else the class
//   AutoTokenizer maps config.json's model_type to;
//   what the class changes: the post-processor of LlamaTokenizerFast and its
//   kin (add_bos_token / add_eos_token), and the special tokens and
//   added_tokens_decoder entries that the fast tokenizer's __init__ adds.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tightfit {

struct TokenizerDefinition {
  nlohmann::json spec;  // a tokenizer.json
  std::string source;   // the file it was read from (for messages and export)
};

// `path`: a model folder, or a tokenizer.json in one. Throws
// std::invalid_argument naming the folder or file, what it cannot
// reproduce, and the fix.
TokenizerDefinition read_hf_tokenizer(const std::string& path);

// The 256-id byte tokenizer (id = the byte) as a tokenizer.json and a
// tokenizer_config.json that transformers and tightfit load to the same ids:
// a BPE model without merges over the ByteLevel alphabet, and no special tokens.
std::string byte_tokenizer_json();
std::string byte_tokenizer_config_json();

// Whether `folder` holds any file a tokenizer is read from.
bool has_tokenizer_files(const std::string& folder);

}  // namespace tightfit
