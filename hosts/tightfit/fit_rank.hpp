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

// Drops a stack whose plan, predicted time and changes to the maths are
// another's with fewer settings: what it adds does nothing here (offload's
// params tier in a full fine-tune that keeps trained weights in memory),
// and a stack that names it would say otherwise.
void drop_settings_that_do_nothing(std::vector<Planned>& fitting);

}  // namespace tightfit::host
