// The preference losses as TRL 0.24 computes them, from per-sequence
// log-probabilities: written with LibTorch's autograd so that the weights a
// schedule hands to sequence_logps (d loss / d logps) are the gradient of
// exactly this code.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace tf_preference {

// A batch's log-probabilities: [chosen; rejected] sums (fp32 [2P]) and
// target counts (int64 [2P]), as sequence_logps gives them.
struct PairLogps {
  at::Tensor chosen, rejected;  // [P] each
};

PairLogps split_pairs(const at::Tensor& rows, int64_t pairs);

struct DpoOptions {
  std::string loss_type = "sigmoid";  // sigmoid | ipo | hinge
  double beta = 0.1;
  double label_smoothing = 0.0;
};

// TRL's DPOTrainer.dpo_loss then .mean(): the loss and the rewards.
struct DpoResult {
  at::Tensor loss;                              // 0-dim
  at::Tensor chosen_rewards, rejected_rewards;  // [P], detached
};

// IPO averages each sequence's log-probability over its tokens (TRL's
// concatenated_forward divides by the completion's token count).
bool averages_logps(const DpoOptions& o);

DpoResult dpo_loss(const PairLogps& policy, const PairLogps& reference, const DpoOptions& o);

// TRL's CPOConfig names and defaults (no reference model; AlphaPO's alpha is
// not offered).
struct CpoOptions {
  std::string loss_type = "sigmoid";  // sigmoid | hinge | ipo | simpo
  double beta = 0.1;
  double label_smoothing = 0.0;
  double cpo_alpha = 1.0;    // weight of the chosen completions' NLL
  double simpo_gamma = 0.5;  // simpo: the target reward margin
};

// IPO and SimPO average each sequence's log-probability over its tokens.
bool averages_logps(const CpoOptions& o);

// TRL's CPOTrainer.get_batch_loss_metrics: cpo_loss(...).mean() plus
// cpo_alpha times the chosen completions' mean NLL over all their tokens.
struct CpoResult {
  at::Tensor loss;                              // 0-dim
  at::Tensor nll;                               // 0-dim, detached (TRL's nll_loss)
  PairLogps used;                               // the log-probs the loss saw (sums or averages)
  at::Tensor chosen_rewards, rejected_rewards;  // [P], detached
};

// `rows`: each row's summed log-probability (fp32 [2P], chosen then
// rejected), `counts` its targets (int64 [2P]).
CpoResult cpo_loss(const at::Tensor& rows, const at::Tensor& counts, int64_t pairs,
                   const CpoOptions& o);

}  // namespace tf_preference
