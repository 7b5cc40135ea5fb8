// The recipe's rewards ([[reward]] plugins, ABI 1.25) scoring sampled
// completions of the run's prompt rows: each completion decoded as TRL's
// batch_decode(skip_special_tokens=True) decodes it, every reward handed the
// prompts, completions, ids and data rows, and what it returns checked — a
// finite score or NaN ("none for this row", TRL's None); an infinity, a
// failure, or a completion that no reward scored stops the call naming the
// reward and the row, so that nothing trains on a garbage reward.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace tightfit {

struct KernelParts;

struct RewardScores {
  at::Tensor scores;   // fp64 [n, R]
  at::Tensor weights;  // fp64 [R]
};

// row_ids int64 [n] (the prompt rows of tf_batch.row_ids), completions
// int64 [n, C] and lengths int64 [n]. Throws std::invalid_argument.
RewardScores score_completions(KernelParts& kernel, const at::Tensor& row_ids,
                               const at::Tensor& completions, const at::Tensor& lengths);

}  // namespace tightfit
