// The preference losses as TRL 0.24 computes them, from per-sequence
// log-probabilities: written with LibTorch's autograd so that the weights a
// schedule hands to sequence_logps (d loss / d logps) are the gradient of
// exactly this code.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
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

inline PairLogps split_pairs(const at::Tensor& rows, int64_t pairs);

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
inline bool averages_logps(const DpoOptions& o);

inline DpoResult dpo_loss(const PairLogps& policy, const PairLogps& reference, const DpoOptions& o);

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
inline bool averages_logps(const CpoOptions& o);

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
inline CpoResult cpo_loss(const at::Tensor& rows, const at::Tensor& counts, int64_t pairs,
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
inline OrpoResult orpo_loss(const at::Tensor& token_logps, const at::Tensor& scored,
                            const at::Tensor& completion, int64_t pairs, const OrpoOptions& o);

// TRL's KTOConfig names and defaults.
struct KtoOptions {
  std::string loss_type = "kto";  // kto | apo_zero_unpaired
  double beta = 0.1;
  double desirable_weight = 1.0;
  double undesirable_weight = 1.0;
};

// Whether the loss reads the KL rows (TRL's calculate_KL).
inline bool reads_kl(const KtoOptions& o);

// TRL's KTOTrainer.kto_loss then losses.nanmean(): `policy` and `reference`
// are the completions' summed log-probs (fp32 [N]), `desirable` bool [N],
// `kl` the detached KL estimate (already the ranks' mean, clamped at 0; 0
// for apo_zero_unpaired).
struct KtoResult {
  at::Tensor loss;                              // 0-dim
  at::Tensor chosen_rewards, rejected_rewards;  // the desirable and the undesirable rows', detached
  at::Tensor chosen_logps, rejected_logps;      // the policy's, detached
};
inline KtoResult kto_loss(const at::Tensor& policy, const at::Tensor& reference,
                          const at::Tensor& desirable, double kl, const KtoOptions& o);

}  // namespace tf_preference

// Definitions (the SDK is header-only).
namespace tf_preference {

inline PairLogps split_pairs(const at::Tensor& rows, int64_t pairs) {
  if (rows.dim() != 1 || rows.size(0) != 2 * pairs)
    throw std::invalid_argument("a preference batch of " + std::to_string(pairs) +
                                " pairs has 2 x that many rows, not " +
                                std::to_string(rows.numel()));
  return {rows.narrow(0, 0, pairs), rows.narrow(0, pairs, pairs)};
}

namespace detail {

// The pairwise losses DPOTrainer and CPOTrainer share, of a pair's logits
// (the margin each trainer defines): sigmoid (with label smoothing), hinge
// and ipo; nullopt for a loss type that is neither's.
inline std::optional<at::Tensor> pair_losses(const std::string& loss_type, const at::Tensor& logits,
                                             double beta, double label_smoothing) {
  if (loss_type == "sigmoid")
    return -at::log_sigmoid(beta * logits) * (1 - label_smoothing) -
           at::log_sigmoid(-beta * logits) * label_smoothing;
  if (loss_type == "hinge") return at::relu(1 - beta * logits);
  if (loss_type == "ipo") return (logits - 1 / (2 * beta)).pow(2);
  return std::nullopt;
}

}  // namespace detail

inline bool averages_logps(const DpoOptions& o) {
  return o.loss_type == "ipo";
}

inline DpoResult dpo_loss(const PairLogps& policy, const PairLogps& reference,
                          const DpoOptions& o) {
  // logits = (pi_c - pi_r) - (ref_c - ref_r), as TRL's reverse-KL path.
  const at::Tensor logratios = policy.chosen - policy.rejected;
  const at::Tensor logits = logratios - (reference.chosen - reference.rejected);
  const std::optional<at::Tensor> losses =
      detail::pair_losses(o.loss_type, logits, o.beta, o.label_smoothing);
  if (!losses)
    throw std::invalid_argument("loss_type \"" + o.loss_type + "\": sigmoid, ipo or hinge");
  DpoResult r;
  r.loss = losses->mean();
  r.chosen_rewards = (o.beta * (policy.chosen - reference.chosen)).detach();
  r.rejected_rewards = (o.beta * (policy.rejected - reference.rejected)).detach();
  return r;
}

inline bool averages_logps(const CpoOptions& o) {
  return o.loss_type == "ipo" || o.loss_type == "simpo";
}

inline CpoResult cpo_loss(const at::Tensor& rows, const at::Tensor& counts, int64_t pairs,
                          const CpoOptions& o) {
  CpoResult r;
  const PairLogps sums = split_pairs(rows, pairs);
  r.used = averages_logps(o) ? split_pairs(rows / counts.to(at::kFloat), pairs) : sums;
  // SimPO is the sigmoid loss with the target margin taken off the logits.
  const bool simpo = o.loss_type == "simpo";
  const at::Tensor logits =
      r.used.chosen - r.used.rejected - (simpo ? o.simpo_gamma / o.beta : 0.0);
  const std::optional<at::Tensor> losses =
      detail::pair_losses(simpo ? "sigmoid" : o.loss_type, logits, o.beta, o.label_smoothing);
  if (!losses)
    throw std::invalid_argument("loss_type \"" + o.loss_type + "\": sigmoid, hinge, ipo or simpo");
  // nn.CrossEntropyLoss over the chosen rows' completion tokens: the mean
  // over all of them, not a mean of per-row means.
  const at::Tensor nll = -sums.chosen.sum() / counts.narrow(0, 0, pairs).sum().to(at::kFloat);
  r.loss = losses->mean();
  if (o.cpo_alpha != 0) r.loss = r.loss + o.cpo_alpha * nll;
  r.nll = (o.cpo_alpha != 0 ? nll : at::zeros_like(nll)).detach();
  r.chosen_rewards = (o.beta * r.used.chosen).detach();
  r.rejected_rewards = (o.beta * r.used.rejected).detach();
  return r;
}

inline OrpoResult orpo_loss(const at::Tensor& token_logps, const at::Tensor& scored,
                            const at::Tensor& completion, int64_t pairs, const OrpoOptions& o) {
  OrpoResult r;
  const at::Tensor mask = completion.to(at::kFloat);
  r.used = split_pairs((token_logps * mask).sum(1) / mask.sum(1), pairs);
  const at::Tensor nll =
      -token_logps.narrow(0, 0, pairs).sum() / scored.narrow(0, 0, pairs).sum().to(at::kFloat);
  // log odds(y|x) = log p - log(1 - p), of the average log-probabilities.
  const at::Tensor& c = r.used.chosen;
  const at::Tensor& j = r.used.rejected;
  const at::Tensor log_odds = (c - j) - (at::log1p(-at::exp(c)) - at::log1p(-at::exp(j)));
  const at::Tensor ratio = at::log_sigmoid(log_odds);
  r.loss = nll - (o.beta * ratio).mean();
  r.nll = nll.detach();
  r.chosen_rewards = (o.beta * c).detach();
  r.rejected_rewards = (o.beta * j).detach();
  r.log_odds_ratio = ratio.mean().detach();
  r.log_odds_chosen = log_odds.mean().detach();
  return r;
}

inline bool reads_kl(const KtoOptions& o) {
  return o.loss_type == "kto";
}

inline KtoResult kto_loss(const at::Tensor& policy, const at::Tensor& reference,
                          const at::Tensor& desirable, double kl, const KtoOptions& o) {
  if (o.loss_type != "kto" && o.loss_type != "apo_zero_unpaired")
    throw std::invalid_argument("kto: unknown loss_type \"" + o.loss_type +
                                "\" (kto or apo_zero_unpaired)");
  const at::Tensor chosen = desirable.nonzero().squeeze(1);
  const at::Tensor rejected = desirable.logical_not().nonzero().squeeze(1);
  const at::Tensor chosen_logratios =
      policy.index_select(0, chosen) - reference.index_select(0, chosen);
  const at::Tensor rejected_logratios =
      policy.index_select(0, rejected) - reference.index_select(0, rejected);
  at::Tensor chosen_losses, rejected_losses;
  if (o.loss_type == "kto") {
    // Eq. (7) of the KTO paper.
    chosen_losses = 1 - at::sigmoid(o.beta * (chosen_logratios - kl));
    rejected_losses = 1 - at::sigmoid(o.beta * (kl - rejected_logratios));
  } else {
    // APO-zero, unpaired (D'Oosterlinck et al. 2024).
    chosen_losses = 1 - at::sigmoid(o.beta * chosen_logratios);
    rejected_losses = at::sigmoid(o.beta * rejected_logratios);
  }
  KtoResult r;
  r.loss = at::cat({o.desirable_weight * chosen_losses, o.undesirable_weight * rejected_losses})
               .nanmean();
  r.chosen_rewards = (o.beta * chosen_logratios).detach();
  r.rejected_rewards = (o.beta * rejected_logratios).detach();
  r.chosen_logps = policy.index_select(0, chosen).detach();
  r.rejected_logps = policy.index_select(0, rejected).detach();
  return r;
}

}  // namespace tf_preference
