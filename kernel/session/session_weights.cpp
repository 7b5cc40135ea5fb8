// The recipe's [model] weights, opened once: the parameters load from it
// stage by stage, and strategies may ask how it stores a matrix
// (param_source_blocks) — while planning as well as while loading.
#include <c10/util/Exception.h>

#include <filesystem>

#include "hf_weights.hpp"
#include "recipe_paths.hpp"
#include "session.hpp"

namespace tightfit {
namespace fs = std::filesystem;

const HfWeightSource* Session::weight_source() {
  if (weight_source_) return weight_source_.get();
  const toml::node* key = recipe_.table("model") ? recipe_.table("model")->get("weights") : nullptr;
  if (!key) return nullptr;
  if (!key->is_string())
    throw RecipeError(recipe_.where(*key) + ": [model].weights must be a path string");
  const fs::path path = resolve_recipe_path(key->value_or(std::string{}), weights_base_dir_);
  try {
    weight_source_ = std::make_unique<HfWeightSource>(path.string());
  } catch (const std::runtime_error& e) {
    throw RecipeError(recipe_.where(*key) + ": " + e.what());
  }
  return weight_source_.get();
}

}  // namespace tightfit
