// What `tightfit run` suggests when a run went past its memory budget: the
// `tightfit fit` command that searches the installed strategies for a stack
// that fits, with the budget the model may have.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "memory_budget.hpp"

namespace tightfit::host {

// `data_bytes`: the host memory the data held (its tracked peak). Where the
// budget is host memory (a CPU run) the data comes out of it, as fit's and
// plan's budgets leave the data out; a GPU's budget is the device's, which
// the data (on the host) does not use. Nothing when there is no budget, or
// when it was the data that did not fit.
std::optional<std::string> fit_hint(const std::string& recipe_path, const MemoryBudget& budget,
                                    int64_t data_bytes);

}  // namespace tightfit::host
