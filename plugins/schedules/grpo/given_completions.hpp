// grpo's test mode: completions read from a file instead of sampled, so a
// step can be held to TRL's on the very completions TRL trained on. One JSON
// line a prompt row:
//   {"row": its index among the run's prompt rows,
//    "completion_ids": [[ids...], ... num_generations lists]}
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tightfit/rl/online_rl.hpp"

class GivenCompletions {
 public:
  // Reads `file` whole; throws std::runtime_error naming file:line.
  GivenCompletions(const std::string& file, int64_t num_generations, int64_t max_length);
  // Row `row`'s completions, [num_generations, longest] padded with 0.
  tf_rl::Sampled of_row(int64_t row) const;

 private:
  std::string file_;
  int64_t num_generations_;
  std::map<int64_t, std::vector<std::vector<int64_t>>> by_row_;
};
