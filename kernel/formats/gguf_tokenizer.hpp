// A GGUF file's tokenizer (tokenizer.ggml.*) as the Hugging Face files a
// model folder would hold: tokenizer.json, tokenizer_config.json (special
// tokens, add-BOS/EOS, chat template) and generation_config.json.
//
// What the file says is followed as llama.cpp reads it, which is also what
// the model's original Hugging Face tokenizer does:
//   tokenizer.ggml.model "gpt2": byte-level BPE with the file's merges and
//     the pre-tokenizer its tokenizer.ggml.pre names (gpt-2, smollm, llama3,
//     qwen2 and their aliases; another name is refused, never guessed);
//   tokenizer.ggml.model "llama": SentencePiece BPE from the pieces, scores
//     and token types, converted as transformers' LlamaConverter does;
//   BOS/EOS added as tokenizer.ggml.add_bos_token / add_eos_token say, with
//     llama.cpp's defaults when absent (BOS for SentencePiece and llama3).
// transformers' own GGUF loader differs from both on some files (it drops
// the pre-tokenizer's digit split, and makes the BOS token the EOS token
// too); docs/models.md lists where.
#pragma once

#include <nlohmann/json.hpp>

#include "gguf_file.hpp"

namespace tightfit::gguf {

struct TokenizerFiles {
  nlohmann::json tokenizer;          // tokenizer.json
  nlohmann::json tokenizer_config;   // tokenizer_config.json
  nlohmann::json generation_config;  // generation_config.json (bos/eos/pad ids)
};

// Throws GgufError naming the file, the key and what to do.
TokenizerFiles tokenizer_files(const GgufReader& file);

// The pre-tokenizer names tokenizer_files reads (for messages and docs).
std::string known_pre_tokenizers();

}  // namespace tightfit::gguf
