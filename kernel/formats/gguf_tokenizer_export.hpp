// A Hugging Face byte-level BPE tokenizer (GPT-2, Llama 3, Qwen2, SmolLM:
// tokenizer.json, with tokenizer_config.json beside it) as the GGUF keys
// llama.cpp's convert_hf_to_gguf.py writes: tokenizer.ggml.model "gpt2",
// tokens, token types (added special tokens control, other added tokens
// user-defined, ids no token holds unused), merges, the pre-tokenizer's
// name, BOS/EOS/UNK/PAD ids, add-BOS/EOS flags and the chat template.
//
// The pre-tokenizer's name is found the way the converter finds it — by what
// the tokenizer does, not by its config: the keys are read back as llama.cpp
// reads them (gguf_tokenizer) and must give the original's ids, special
// tokens and BOS/EOS included, on a check text (digits, contractions,
// whitespace runs, several scripts, code, every added token); the first
// name of gpt-2, smollm, llama-bpe and qwen2 that does is written. A
// tokenizer none reproduces is refused, never written approximately.
#pragma once

#include <string>

#include "gguf_writer.hpp"

namespace tightfit::gguf {

// `tokenizer_json`: the tokenizer.json a run read. Throws GgufError saying
// why it cannot be written.
void write_hf_tokenizer_keys(const std::string& tokenizer_json, GgufWriter& out);

}  // namespace tightfit::gguf
