// Pieces of the activation bytes per token that models declare for `plan`
// (declare_stage's activation_bytes_per_token), shared by the built-in models.
// Each is what autograd keeps alive at the end of the forward pass, as
// measured on LibTorch's CPU kernels (tests/test_plan.cpp checks the sums).
#pragma once

#include <cstdint>

namespace tf_sdk {

// The loss at the end of the head: the logits in the compute dtype (the
// kernel's cross-entropy keeps fp32 logits for its backward, which it writes
// their gradient over) and the fp32 copy of low-precision logits it keeps
// instead.
inline int64_t loss_activation_bytes(int64_t vocab, int64_t elt) {
  return vocab * elt + (elt != 4 ? vocab * 4 : 0);
}

// Flash-style scaled_dot_product_attention keeps one fp32 log-sum-exp per
// head and token besides q, k, v and its output.
inline int64_t attention_lse_bytes(int64_t n_head) {
  return 4 * n_head;
}

}  // namespace tf_sdk
