// The training loss: mean cross-entropy of [N, V] logits against [N] targets,
// computed without materialising the log-softmax. Forward reads the logits
// once per block of rows for their log-sum-exp; backward turns the saved
// logits, in place, into their gradient (softmax - onehot) / N. Against
// at::cross_entropy_loss that is one [N, V] tensor fewer in forward (the
// log-probabilities) and one fewer in backward (their gradient), and two
// passes over them fewer — for a 50k vocabulary over 1,024 tokens, 206 MB
// each. Same value and gradient up to float rounding.
#pragma once

#include <ATen/ATen.h>

#include "ignore_index.hpp"

namespace tightfit {

// Rows per block: the block's exp temporary stays near 8 MiB.
int64_t cross_entropy_block_rows(int64_t vocab);

// logits [N, V] float, targets [N] int64; the mean over the rows whose target
// is not kIgnoreIndex (0 when none counts). `counted`: how many rows count,
// when the caller knows it (from the batch, on the host); -1 counts them on
// the device, with a read.
at::Tensor cross_entropy_mean(const at::Tensor& logits, const at::Tensor& targets,
                              int64_t counted = -1);

// One chunk of rows of a loss computed chunk by chunk (the fused head,
// fused_head_loss.hpp): the sum of the counted rows' losses, a 0-dim fp32
// tensor. With `grad` defined ([m, V] fp32, may be `logits` itself), writes
// into it d loss / d logits for a loss scaled by `grad_scale`:
// (softmax - onehot) * grad_scale on counted rows, 0 on ignored ones.
at::Tensor cross_entropy_rows(const at::Tensor& logits, const at::Tensor& targets,
                              const at::Tensor& grad, double grad_scale);

// The same per row: each row's loss ([m] fp32, 0 on ignored rows), and with
// `grad` the gradient of sum_r weights[r] * loss_r scaled by grad_scale
// (`weights` [m], or undefined for 1 each).
at::Tensor cross_entropy_each(const at::Tensor& logits, const at::Tensor& targets,
                              const at::Tensor& grad, double grad_scale, const at::Tensor& weights);

}  // namespace tightfit
