#include "tokenizer_choice.hpp"

#include <filesystem>
#include <stdexcept>

#include "bpe_tokenizer.hpp"

namespace tightfit {
namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec, const std::string& base_dir) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  fs::path p = spec;
  if (p.is_relative() && !fs::exists(p) && !base_dir.empty()) p = fs::path(base_dir) / p;
  if (!fs::exists(p))
    throw std::invalid_argument(
        "tokenizer \"" + spec +
        "\" is neither \"byte\" nor a tokenizer.json or a model folder holding a tokenizer");
  return BpeTokenizer::load(p.string());
}

}  // namespace tightfit
