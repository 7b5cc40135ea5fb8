// Group Relative Policy Optimization's maths as TRL 0.24's GRPOTrainer
// computes it (Shao et al. 2024; Dr. GRPO, Liu et al. 2025; DAPO, Yu et al.
// 2025; GSPO, Zheng et al. 2025), on tensors a schedule already holds:
//
//   group_advantages  each completion's reward less its group's mean (the G
//                     completions of one prompt), divided by the group's
//                     standard deviation, the batch's, or nothing
//                     (scale_rewards = group | batch | none), as
//                     _generate_and_score_completions does;
//   grpo_loss         the clipped surrogate over the completion tokens, with
//                     an importance weight per token or per sequence (GSPO),
//                     the k3 estimate of the KL to the reference times beta,
//                     reduced as loss_type says (grpo, bnpo, dr_grpo, dapo),
//                     and the clip ratios TRL logs, as _compute_loss does.
//
// Autograd differentiates the loss with respect to the policy's per-token
// log-probabilities; a schedule hands that gradient to the host's backward
// (token_logps with weights), as dpo does with its sequence log-probs.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace tf_rl {

enum class ScaleRewards { kGroup, kBatch, kNone };
enum class LossType { kGrpo, kBnpo, kDrGrpo, kDapo };
enum class ImportanceLevel { kToken, kSequence };

inline ScaleRewards scale_rewards_named(const std::string& s) {
  if (s == "group") return ScaleRewards::kGroup;
  if (s == "batch") return ScaleRewards::kBatch;
  if (s == "none") return ScaleRewards::kNone;
  throw std::invalid_argument("scale_rewards = \"" + s + "\": group, batch or none");
}
inline LossType loss_type_named(const std::string& s) {
  if (s == "grpo") return LossType::kGrpo;
  if (s == "bnpo") return LossType::kBnpo;
  if (s == "dr_grpo") return LossType::kDrGrpo;
  if (s == "dapo") return LossType::kDapo;
  throw std::invalid_argument("loss_type = \"" + s + "\": grpo, bnpo, dr_grpo or dapo");
}
inline ImportanceLevel importance_level_named(const std::string& s) {
  if (s == "token") return ImportanceLevel::kToken;
  if (s == "sequence") return ImportanceLevel::kSequence;
  throw std::invalid_argument("importance_sampling_level = \"" + s + "\": token or sequence");
}

struct Advantages {
  at::Tensor advantages;   // [N]
  at::Tensor group_mean;   // [N]: each completion's group's mean reward
  at::Tensor std;          // [N]: the deviation it was scaled by (group's or batch's)
  at::Tensor std_is_zero;  // [N] bool: a group (or batch) whose rewards are all equal
};

// rewards: [N] fp32, the reward functions' weighted sum, a prompt's G
// completions next to each other (N = prompts x G). torch's std is the
// unbiased one (N - 1), as TRL's; 1e-4 keeps an all-equal group finite.
inline Advantages group_advantages(const at::Tensor& rewards, int64_t group_size,
                                   ScaleRewards scale) {
  if (group_size < 1 || rewards.dim() != 1 || rewards.size(0) % group_size != 0)
    throw std::invalid_argument("group_advantages: " + std::to_string(rewards.numel()) +
                                " rewards do not make groups of " + std::to_string(group_size));
  Advantages a;
  const at::Tensor groups = rewards.view({-1, group_size});
  a.group_mean = groups.mean(1).repeat_interleave(group_size, 0);
  a.advantages = rewards - a.group_mean;
  a.std = scale == ScaleRewards::kBatch ? rewards.std().expand_as(rewards)
                                        : groups.std(1).repeat_interleave(group_size, 0);
  a.std_is_zero = at::isclose(a.std, at::zeros_like(a.std));
  if (scale != ScaleRewards::kNone) a.advantages = a.advantages / (a.std + 1e-4);
  return a;
}

struct GrpoOptions {
  LossType loss_type = LossType::kDapo;  // TRL 0.24's default
  ImportanceLevel level = ImportanceLevel::kToken;
  double epsilon_low = 0.2;
  double epsilon_high = 0.2;            // TRL: epsilon_high defaults to epsilon
  std::optional<double> delta;          // two-sided clipping's upper bound on the ratio
  double beta = 0.0;                    // the KL term's weight (0: no reference pass)
  int64_t max_completion_length = 256;  // dr_grpo's constant normalizer
  // grpo, bnpo, dr_grpo: divided by the micro-batches of one update.
  int64_t accumulation_steps = 1;
  // dapo: the completion tokens of the whole update (every micro-batch's,
  // over the ranks), which each micro-batch's sum is divided by.
  double tokens_in_update = 0;
};

struct GrpoLoss {
  at::Tensor loss;  // 0-d, differentiable with respect to the policy's log-probs
  // TRL's metrics of this micro-batch (means over completion tokens, or
  // over sequences at the sequence level); kl is NaN when beta is 0.
  double kl = 0, clip_low = 0, clip_high = 0, clip_region = 0;
};

// logps: the policy's per-token log-probabilities [B, T] of the completion
// tokens (requires grad); old: those of the model that sampled them
// (undefined: this pass's, detached: one iteration per generation);
// ref: the reference's (needed when beta != 0); advantages [B]; mask [B, T]
// 1 on a completion's tokens (to its EOS), 0 after.
inline GrpoLoss grpo_loss(const at::Tensor& logps, const at::Tensor& old, const at::Tensor& ref,
                          const at::Tensor& advantages, const at::Tensor& mask,
                          const GrpoOptions& o) {
  if (o.beta != 0 && !ref.defined())
    throw std::invalid_argument("grpo_loss: beta != 0 needs the reference's log-probs");
  const at::Tensor m = mask.to(logps.scalar_type());
  const at::Tensor old_logps = old.defined() ? old : logps.detach();
  const at::Tensor log_ratio = logps - old_logps;
  at::Tensor log_weights = log_ratio;
  if (o.level == ImportanceLevel::kSequence)
    log_weights = ((log_ratio * m).sum(-1) / m.sum(-1).clamp_min(1.0)).unsqueeze(-1);
  at::Tensor coef_1 = log_weights.exp();
  const at::Tensor coef_2 = coef_1.clamp(1 - o.epsilon_low, 1 + o.epsilon_high);
  if (o.delta) coef_1 = coef_1.clamp_max(*o.delta);
  const at::Tensor adv = advantages.to(logps.scalar_type()).unsqueeze(1);
  at::Tensor per_token = -at::min(coef_1 * adv, coef_2 * adv);
  at::Tensor kl;
  if (o.beta != 0) {
    const at::Tensor d = ref - logps;
    kl = d.exp() - d - 1;
    per_token = per_token + o.beta * kl;
  }
  GrpoLoss out;
  const auto rows = static_cast<double>(per_token.size(0));
  switch (o.loss_type) {
    case LossType::kGrpo:
      out.loss = ((per_token * m).sum(-1) / m.sum(-1).clamp_min(1.0)).mean() /
                 static_cast<double>(o.accumulation_steps);
      break;
    case LossType::kBnpo:
      out.loss = (per_token * m).sum() / m.sum().clamp_min(1.0) /
                 static_cast<double>(o.accumulation_steps);
      break;
    case LossType::kDrGrpo:
      out.loss = (per_token * m).sum() / (rows * static_cast<double>(o.max_completion_length)) /
                 static_cast<double>(o.accumulation_steps);
      break;
    case LossType::kDapo:
      if (!(o.tokens_in_update > 0))
        throw std::invalid_argument("grpo_loss: loss_type dapo needs the update's token count");
      out.loss = (per_token * m).sum() / o.tokens_in_update;
      break;
  }
  // The metrics, as masked_batch_mean takes them.
  at::NoGradGuard no_grad;
  const at::Tensor tokens = m.sum().clamp_min(1.0);
  auto batch_mean = [&](const at::Tensor& x) {
    return (x.size(1) == 1 ? x.to(at::kDouble).mean() : (x * m).sum() / tokens).item<double>();
  };
  out.kl = kl.defined() ? batch_mean(kl.detach()) : std::nan("");
  const at::Tensor low = (coef_1 < 1 - o.epsilon_low) & (adv < 0);
  const at::Tensor high = (coef_1 > 1 + o.epsilon_high) & (adv > 0);
  out.clip_low = batch_mean(low.to(m.scalar_type()));
  out.clip_high = batch_mean(high.to(m.scalar_type()));
  out.clip_region = batch_mean((low | high).to(m.scalar_type()));
  return out;
}

}  // namespace tf_rl
