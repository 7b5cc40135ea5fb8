// The tokenizer a recipe names: "byte", or a tokenizer file or model folder.
#pragma once

#include <memory>
#include <string>

#include "tokenizer.hpp"

namespace tightfit {

// "byte", or a Hugging Face tokenizer.json (or a folder holding one; relative
// paths from `base_dir`) with byte-level BPE. Throws std::invalid_argument.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec,
                                          const std::string& base_dir = {});

}  // namespace tightfit
