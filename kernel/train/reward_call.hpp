// One reward's score of a batch of completions, within its time limit
// ([[reward]] time_limit): the call runs on a thread of its own while the
// host waits for it. A reward that returns in time is exactly as if called
// directly (its host services are served on that thread). One that does not
// is left running, abandoned: the run stops with an error naming the reward
// and its limit, and the reward's state and context are never freed under it
// (it is never destroyed).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "tightfit/plugin_api.h"

namespace tightfit {

struct RewardInstance;

// What a reward reads, alive while the host or a call still running holds it.
struct RewardInput {
  std::vector<std::string> prompts, completions, rows;
  std::vector<const char*> prompt_ptrs, completion_ptrs, row_ptrs;
  at::Tensor ids, lengths;  // int64 [n, C] (-1 past each end), [n]
  int32_t group_size = 1;
  tf_reward_batch batch{};  // points into the above (set by finish())
  void finish();
};

// The reward's n scores (NaN where it gave none). Throws PluginCallError for
// a failure or a call past the time limit.
std::vector<double> score_within_time_limit(RewardInstance& reward,
                                            const std::shared_ptr<RewardInput>& input);

}  // namespace tightfit
