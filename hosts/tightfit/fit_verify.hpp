// `tightfit fit --verify`: runs a few steps of some of the stacks that fit
// and compares the planned peak and predicted step time with the measured.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fit_planned.hpp"

namespace tightfit::host {

struct VerifyOptions {
  int top = 3;          // stacks to run
  int steps = 4;        // steps of each
  bool spread = false;  // spread over the whole ranking, not the top ones
  bool json = false;    // print nothing (the caller prints `result`)
  std::string out_dir;  // the recipe's out_dir: runs go under fit-verify/ in it
};

// Runs the stacks, in their own processes; adds "verify" (and, for two or
// more, "verify_rank_correlation") to `result`.
void verify_stacks(const std::vector<Planned>& fitting, double plain_s, const VerifyOptions& o,
                   nlohmann::json& result);

}  // namespace tightfit::host
