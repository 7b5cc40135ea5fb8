// How `tightfit fit` orders the stacks that fit a budget.
#pragma once

#include <string>
#include <vector>

#include "fit_planned.hpp"

namespace tightfit::host {

// A stack whose safe budget (plan + margin of error) fits comes before any
// that fits only by its plan; then the fastest (with --objective quality,
// the least change to the maths first). Times within 2% of each other are a
// tie, since the cost model is not finer than that: among them the stack
// that changes the maths least wins, then the one with fewer strategies,
// then the smaller (an exact stack 0.4% slower than a lossy one wins).
void rank_stacks(std::vector<Planned>& fitting, int64_t budget, const std::string& objective);

}  // namespace tightfit::host
