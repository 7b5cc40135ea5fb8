// The preference losses as TRL 0.24 computes them, from per-sequence
// log-probabilities: written with LibTorch's autograd so that the weights a
// schedule hands to sequence_logps (d loss / d logps) are the gradient of
// exactly this code.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "tightfit/plugin_api.h"

namespace tf_preference {

// The target that scores nothing (transformers' and TRL's label padding).
inline constexpr int64_t kIgnoreIndex = -100;

// A backward that keeps the activations of half the batch's rows (one side
// of each pair, or KTO's completions without their KL rows): the plan's
// activations, half of the plain step's.
inline void plan_half_the_activations(const tf_model_summary* model, tf_memory_estimate* out) {
  if (model != nullptr)
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_ACTIVATIONS] -= model->activation_bytes / 2;
}

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

// TRL's ORPOConfig: beta weighs the odds-ratio term.
struct OrpoOptions {
  double beta = 0.1;
};

// TRL's ORPOTrainer.get_batch_loss_metrics: the chosen rows' NLL over every
// token after the first (prompt and completion, nn.CrossEntropyLoss's mean
// over all of them) minus beta times the mean log-sigmoid of the log odds
// ratio of the completions' average log-probabilities.
struct OrpoResult {
  at::Tensor loss;                              // 0-dim
  at::Tensor nll;                               // 0-dim, detached (TRL's nll_loss)
  PairLogps used;                               // each completion's average log-probability
  at::Tensor chosen_rewards, rejected_rewards;  // [P], detached
  at::Tensor log_odds_ratio, log_odds_chosen;   // 0-dim, detached (TRL's metrics)
};

// `token_logps`: fp32 [2P, T], each token's log-probability (0 where
// nothing is scored), chosen rows first; `scored`: bool [2P, T], the tokens
// scored (every one after a row's first); `completion`: bool [2P, T], the
// completions' among them.
OrpoResult orpo_loss(const at::Tensor& token_logps, const at::Tensor& scored,
                     const at::Tensor& completion, int64_t pairs, const OrpoOptions& o);

// TRL's KTOConfig names and defaults.
struct KtoOptions {
  std::string loss_type = "kto";  // kto | apo_zero_unpaired
  double beta = 0.1;
  double desirable_weight = 1.0;
  double undesirable_weight = 1.0;
};

// Whether the loss reads the KL rows (TRL's calculate_KL).
bool reads_kl(const KtoOptions& o);

// TRL's KTOTrainer.kto_loss then losses.nanmean(): `policy` and `reference`
// are the completions' summed log-probs (fp32 [N]), `desirable` bool [N],
// `kl` the detached KL estimate (already the ranks' mean, clamped at 0; 0
// for apo_zero_unpaired).
struct KtoResult {
  at::Tensor loss;                              // 0-dim
  at::Tensor chosen_rewards, rejected_rewards;  // the desirable and the undesirable rows', detached
  at::Tensor chosen_logps, rejected_logps;      // the policy's, detached
};
KtoResult kto_loss(const at::Tensor& policy, const at::Tensor& reference,
                   const at::Tensor& desirable, double kl, const KtoOptions& o);

}  // namespace tf_preference
