// The error of a recipe a person wrote: file:line:column and what to do
// (the host exits 2 for it). Below the recipe parser, so the checks it runs
// first (toml_nesting) can throw it too.
#pragma once

#include <stdexcept>

namespace tightfit {

struct RecipeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace tightfit
