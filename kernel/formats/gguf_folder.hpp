// A GGUF file seen as the Hugging Face model folder it was converted from:
// config.json from its metadata (gguf_model), and tokenizer.json,
// tokenizer_config.json (chat template, special tokens) and
// generation_config.json from its tokenizer (gguf_tokenizer). Model plugins,
// the tokenizer and the chat template then read a GGUF model as they read a
// downloaded folder; the weights stay in the GGUF file and are read from it.
//
// The folder is written once into tightfit's cache, named by the file's
// stem and a hash of what was written (so a changed file or a newer
// conversion gets a new folder), atomically: a folder there is whole or
// absent. The cache is $TIGHTFIT_CACHE, else $XDG_CACHE_HOME/tightfit,
// else ~/.cache/tightfit; tightfit writes nothing else there.
#pragma once

#include <string>

namespace tightfit::gguf {

struct ModelFolder {
  std::string path;             // config.json, and the tokenizer's files when it converted
  std::string tokenizer_error;  // why the file's tokenizer did not convert; "" when it did
};

// Throws GgufError for a file that is not a GGUF model tightfit reads, and
// std::runtime_error when the cache cannot be written.
ModelFolder model_folder(const std::string& gguf_path);

// The folder model_folder writes under.
std::string cache_root();

}  // namespace tightfit::gguf
