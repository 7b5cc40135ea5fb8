// The kernel's own recipe tables ([run], [data], [optimizer], [save]): the
// keys Session validates a recipe against and `tightfit plugins info` lists.
#pragma once

#include <string>
#include <vector>

#include "recipe.hpp"

namespace tightfit {

const std::vector<KeySpec>& run_keys();
const std::vector<KeySpec>& data_keys();
const std::vector<KeySpec>& optimizer_keys();
const std::vector<KeySpec>& save_keys();
// Every table a recipe may have at its top level.
const std::vector<std::string>& kernel_top_level_tables();

}  // namespace tightfit
