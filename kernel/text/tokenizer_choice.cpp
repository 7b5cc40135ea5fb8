#include "tokenizer_choice.hpp"

#include <filesystem>
#include <stdexcept>

#include "bpe_tokenizer.hpp"
#include "recipe_paths.hpp"

namespace tightfit {
namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec, const std::string& base_dir) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  const fs::path p = resolve_recipe_path(spec, base_dir);
  std::error_code ec;
  if (!fs::exists(p, ec))
    throw std::invalid_argument(
        "tokenizer \"" + spec +
        "\" is neither \"byte\" nor a tokenizer.json or a model folder holding a tokenizer");
  return BpeTokenizer::load(p.string());
}

}  // namespace tightfit
