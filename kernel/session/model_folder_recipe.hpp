// The recipe that builds the model a Hugging Face folder describes: what
// `tightfit generate FOLDER` and `export FOLDER` open, and what a reward
// model (score_texts) is opened as.
#pragma once

#include <filesystem>
#include <string>

#include "recipe.hpp"

namespace tightfit {

// The model plugin that declares the folder's model_type (plugin = "auto"),
// its weights from `weights` (the folder itself, or the GGUF file the folder
// was converted from), on `device` ("" = [run]'s default), no data read.
// Throws RecipeError when the folder has no readable config.json.
Recipe recipe_for_model_folder(const std::filesystem::path& folder, const std::string& weights,
                               const std::string& device = "");

}  // namespace tightfit
