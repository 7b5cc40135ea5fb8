#include "preference_loss.hpp"

#include <optional>
#include <stdexcept>

namespace tf_preference {

PairLogps split_pairs(const at::Tensor& rows, int64_t pairs) {
  if (rows.dim() != 1 || rows.size(0) != 2 * pairs)
    throw std::invalid_argument("a preference batch of " + std::to_string(pairs) +
                                " pairs has 2 x that many rows, not " +
                                std::to_string(rows.numel()));
  return {rows.narrow(0, 0, pairs), rows.narrow(0, pairs, pairs)};
}

namespace {

// The pairwise losses DPOTrainer and CPOTrainer share, of a pair's logits
// (the margin each trainer defines): sigmoid (with label smoothing), hinge
// and ipo; nullopt for a loss type that is neither's.
std::optional<at::Tensor> pair_losses(const std::string& loss_type, const at::Tensor& logits,
                                      double beta, double label_smoothing) {
  if (loss_type == "sigmoid")
    return -at::log_sigmoid(beta * logits) * (1 - label_smoothing) -
           at::log_sigmoid(-beta * logits) * label_smoothing;
  if (loss_type == "hinge") return at::relu(1 - beta * logits);
  if (loss_type == "ipo") return (logits - 1 / (2 * beta)).pow(2);
  return std::nullopt;
}

}  // namespace

bool averages_logps(const DpoOptions& o) {
  return o.loss_type == "ipo";
}

DpoResult dpo_loss(const PairLogps& policy, const PairLogps& reference, const DpoOptions& o) {
  // logits = (pi_c - pi_r) - (ref_c - ref_r), as TRL's reverse-KL path.
  const at::Tensor logratios = policy.chosen - policy.rejected;
  const at::Tensor logits = logratios - (reference.chosen - reference.rejected);
  const std::optional<at::Tensor> losses =
      pair_losses(o.loss_type, logits, o.beta, o.label_smoothing);
  if (!losses)
    throw std::invalid_argument("loss_type \"" + o.loss_type + "\": sigmoid, ipo or hinge");
  DpoResult r;
  r.loss = losses->mean();
  r.chosen_rewards = (o.beta * (policy.chosen - reference.chosen)).detach();
  r.rejected_rewards = (o.beta * (policy.rejected - reference.rejected)).detach();
  return r;
}

bool averages_logps(const CpoOptions& o) {
  return o.loss_type == "ipo" || o.loss_type == "simpo";
}

CpoResult cpo_loss(const at::Tensor& rows, const at::Tensor& counts, int64_t pairs,
                   const CpoOptions& o) {
  CpoResult r;
  const PairLogps sums = split_pairs(rows, pairs);
  r.used = averages_logps(o) ? split_pairs(rows / counts.to(at::kFloat), pairs) : sums;
  // SimPO is the sigmoid loss with the target margin taken off the logits.
  const bool simpo = o.loss_type == "simpo";
  const at::Tensor logits =
      r.used.chosen - r.used.rejected - (simpo ? o.simpo_gamma / o.beta : 0.0);
  const std::optional<at::Tensor> losses =
      pair_losses(simpo ? "sigmoid" : o.loss_type, logits, o.beta, o.label_smoothing);
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

OrpoResult orpo_loss(const at::Tensor& token_logps, const at::Tensor& scored,
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

bool reads_kl(const KtoOptions& o) {
  return o.loss_type == "kto";
}

KtoResult kto_loss(const at::Tensor& policy, const at::Tensor& reference,
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
