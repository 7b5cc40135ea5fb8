// Where a path a recipe gives is read from: as written when it is there from
// the working directory, else beside the recipe (a recipe in configs/ names
// configs/data/... as data/...). Every reader of a recipe's paths (the data,
// the tokenizer, the weights, a plugin's PATH keys, run --dry-run's check)
// resolves them here, so a recipe copied elsewhere reads the same files
// wherever it is run from, or says which one it cannot find.
#pragma once

#include <filesystem>
#include <string>

namespace tightfit {

// `spec` as written when it exists from here (or is absolute, or no recipe
// folder is known); else the recipe folder's when that exists; else as
// written, so that an error names the path the recipe gave.
std::filesystem::path resolve_recipe_path(const std::string& spec, const std::string& recipe_dir);

// True when `spec` is found by resolve_recipe_path's rule.
bool recipe_path_exists(const std::string& spec, const std::string& recipe_dir);

}  // namespace tightfit
