// The summary's reward line for a run of a schedule that samples its own
// completions (online RL): the mean of its logged "reward" (TRL's name: the
// mean over a step's completions of their weighted rewards) over the run's
// first steps and over its last, from metrics.jsonl.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace tightfit::host {

// "0.097 over steps 1-10 -> 0.430 over steps 51-60 (grpo.reward, ...)", or
// nothing when the file holds no `schedule`.reward.
std::optional<std::string> reward_before_after(const std::filesystem::path& metrics,
                                               const std::string& schedule);

}  // namespace tightfit::host
