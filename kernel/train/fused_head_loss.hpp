// The head's projection fused with the loss: logits = hidden W^T + b and
// their mean cross-entropy, a chunk of tokens at a time, so that the
// [tokens x vocabulary] logits and their gradient never exist whole (as
// Liger Kernel's fused linear cross-entropy and Apple's Cut Cross-Entropy).
//
// The gradients are computed in forward, chunk by chunk, right after the
// chunk's loss — d hidden into a [tokens x width] buffer, d W and d b
// accumulated over the chunks — and handed to autograd in backward. So no
// matmul is repeated (the head costs what it did unfused) and what forward
// keeps for backward is the width-sized gradient, not the vocabulary-sized
// logits: at a 152k vocabulary and 4,096 tokens, 2.5 GB of fp32 logits
// become one chunk's 64 MiB while forward runs.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace tightfit {

// The projection as the loss computes with it: the weights the head would
// have used, differentiable back to their parameters when those train.
struct HeadProjection {
  at::Tensor weight;   // [V, C]
  at::Tensor bias;     // [V], or undefined
  double softcap = 0;  // logits c tanh(z / c) (Gemma 2's final cap); 0: none
};

// Tokens per chunk: `requested` when positive, else as many as keep a
// chunk's fp32 logits near 64 MiB (a multiple of 16 rows, at least 16).
int64_t fused_loss_chunk_rows(int64_t vocab, int64_t requested);

// The mean cross-entropy of hidden W^T + b (capped as c tanh(z / c) when the
// projection has a softcap c) against `targets` (kIgnoreIndex rows count
// nothing), as cross_entropy_mean of the whole logits. hidden
// [..., C]; targets of hidden's leading shape, int64. Computes with W's
// dtype, or the autocast dtype where autocast is on, as linear would.
// When grad mode is on and any input requires grad, the result has a
// backward: `grad_scale` is the factor the loss will be multiplied by before
// backward (loss scaling, gradient accumulation), which the gradients
// computed in forward carry so that 16-bit ones keep their range.
// `counted`: how many targets are not kIgnoreIndex when the caller knows it
// (from the batch, on the host); -1 counts them here, with a read.
// Targets on the host (as a batch brings them) let it project only the rows
// whose target counts (a prompt's positions cost nothing, as TRL's
// logits_to_keep); on a device it projects every row, as reading which
// count would wait for the device.
at::Tensor fused_head_loss(const at::Tensor& hidden, const at::Tensor& targets,
                           const HeadProjection& projection, int64_t chunk_rows, double grad_scale,
                           int64_t counted = -1);

// The same chunks for a loss that weighs each target: sum_t weights[t] *
// CE_t (weights fp32, one per target; 0 where ignored), with its backward
// as above; and every target's own cross-entropy (0 where ignored) written
// into `each` (fp32, one slot per target, on hidden's device). A preference
// schedule's pass: the summed log-probabilities of each row are -each's
// row sums, and weights d loss / d logp make the gradient its loss's.
// `weights` may be undefined where no gradient is wanted. `mean_logits`
// (fp32, one slot per target, when defined) receives each row's logits
// averaged over the vocabulary, capped as the loss sees them: TRL's
// logits/chosen and logits/rejected before their mean over the tokens.
// `logits_scale` multiplies the (capped) logits before the cross-entropy
// (1 / temperature); `entropies` (one slot per target, when defined)
// receives each position's entropy after it, 0 where ignored.
at::Tensor fused_head_weighted_loss(const at::Tensor& hidden, const at::Tensor& targets,
                                    const HeadProjection& projection, int64_t chunk_rows,
                                    double grad_scale, const at::Tensor& weights,
                                    const at::Tensor& each, const at::Tensor& mean_logits = {},
                                    double logits_scale = 1.0, const at::Tensor& entropies = {});

}  // namespace tightfit
