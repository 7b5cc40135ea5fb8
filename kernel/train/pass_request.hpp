// One pass of the model as a value: what it runs over, what it computes,
// with which weights, and whether it back-propagates (PassRequest), and what
// it gave (PassOutcome). Executor::run takes one and gives the other, and
// nothing of it outlives the call: no option is "for the next pass", and
// the adapters and the weights' copies are as they were when it returns.
// The ABI's run_pass (tf_pass, tf_pass_result) is this, size-prefixed.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

#include "pending_reads.hpp"

namespace tightfit {

// What a pass hands every stage besides the tokens (tf_stage_call).
struct PassRows {
  PassRows(at::Tensor positions_ = {}, at::Tensor attention_mask_ = {})
      : positions(std::move(positions_)), attention_mask(std::move(attention_mask_)) {}
  // int64 [B, T]: packed rows' per-token positions (the model must declare
  // TF_MODEL_FEATURE_POSITIONS); undefined: 0..T-1 in every row.
  at::Tensor positions;
  // int64 [B, T]: 1 where the token is an example's, 0 where it pads;
  // undefined: none pads.
  at::Tensor attention_mask;
  // false when the batch came from a schedule whose tf_batch cannot carry
  // the mask (ABI before 1.16): a model's loss term is then refused.
  bool padding_known = true;
};

struct PassRequest {
  enum class Compute {
    kLoss,           // the mean cross-entropy of the targets (and the model's terms)
    kSequenceLogps,  // each row's summed target log-probability
    kTokenLogps,     // each target's log-probability
  };
  Compute compute = Compute::kLoss;
  at::Tensor tokens, targets;  // int64 [B, T]
  PassRows rows;
  bool backward = false;
  // kLoss with backward: the loss's factor (a micro-batch's weight).
  double loss_scale = 1.0;
  // Logps with backward: d loss / d logps, fp32 [B] (sequence) or [B, T]
  // (token); the backward is that of sum weights * logps.
  at::Tensor grad_weights;
  // The base model alone: the strategies' adapters off for this pass.
  bool adapters_off = false;
  // Read the frozen copies declared under this prefix ("": the parameters).
  std::string param_copies;
  // Logps: take the model's own loss terms (a mixture of experts'
  // load-balancing loss), back-propagated with this weight; their sum is
  // PassOutcome::loss_terms. Unset: such a pass refuses them.
  std::optional<double> loss_terms_weight;
  // Logps: also each position's logits averaged over the vocabulary.
  bool mean_logits = false;
  // Token logps: the logits divided by this first; also each position's entropy.
  double temperature = 1.0;
  bool entropies = false;
  // kLoss: the loss stays on the device and is read with the host's next
  // read (the update's gradient norm), which hands it to `deferred`;
  // unset: read before run returns.
  PendingReads::Fill deferred;
};

struct PassOutcome {
  // kLoss: the mean loss (the model's terms in it), unless deferred.
  double loss = 0;
  bool finite = true;  // the loss, or every log-probability, is finite
  int64_t n_tokens = 0;
  // Logps: fp32 on the CPU, [B] (sequence) or [B, T] (token); counts: each
  // row's targets, int64 [B] (sequence).
  at::Tensor logps, counts;
  at::Tensor mean_logits;  // fp32 [B, T] on the CPU, when asked
  at::Tensor entropies;    // fp32 [B, T] on the CPU, when asked
  double loss_terms = 0;   // when taken
};

}  // namespace tightfit
