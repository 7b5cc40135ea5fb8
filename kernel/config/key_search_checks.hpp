// Checks what a plugin declares `tightfit fit` may try (key_search.hpp)
// against its own keys, as a recipe's values are checked.
#pragma once

#include <string>
#include <vector>

#include "recipe.hpp"

namespace tightfit {

// Each value is one the key accepts (type, range, choices), `with` names
// another key of the plugin, a FOLLOWS key and its `with` are numbers with
// defaults. Throws std::runtime_error naming the plugin, the key and the value.
void check_key_searches(const std::vector<KeySpec>& keys, const std::string& plugin);

}  // namespace tightfit
