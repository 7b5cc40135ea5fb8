// Rows packed with several examples ([data] packing = true): the host hands
// each stage the tokens' positions (tf_stage_call.positions, ABI 1.3), and a
// model that declares TF_MODEL_FEATURE_POSITIONS computes every example as if
// it had the row to itself — positions restart, attention stays inside.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>

#include "tightfit/plugin_api.h"

namespace tf_sdk {

// The call's positions (int64 [B, T]), or an undefined tensor: 0..T-1 in
// every row, when the host sends none or predates the field.
inline at::Tensor call_positions(const tf_stage_call* call) {
  if (call->struct_size < offsetof(tf_stage_call, positions) + sizeof(call->positions) ||
      call->positions == nullptr)
    return {};
  return *reinterpret_cast<const at::Tensor*>(call->positions);
}

// The call's attention mask (int64 [B, T], 1 where the token is an
// example's, 0 where it pads its row; ABI 1.16), or an undefined tensor:
// every token is an example's.
inline at::Tensor call_attention_mask(const tf_stage_call* call) {
  if (call->struct_size < offsetof(tf_stage_call, attention_mask) + sizeof(call->attention_mask) ||
      call->attention_mask == nullptr)
    return {};
  return *reinterpret_cast<const at::Tensor*>(call->attention_mask);
}

// Which example each token belongs to: a position that is not the previous
// one plus 1 starts the next (transformers' find_packed_sequence_indices).
inline at::Tensor packed_example_ids(const at::Tensor& positions) {
  at::Tensor step = at::diff(positions, 1, -1, positions.slice(-1, 0, 1) - 1);
  return step.ne(1).cumsum(-1);
}

// Where T queries at positions pos0 .. pos0 + T - 1 may look among S keys at
// 0 .. S - 1, bool [T, S]: causal, and with window > 0 only the `window`
// latest keys (the query's own included).
inline at::Tensor causal_mask(int64_t T, int64_t S, int64_t pos0, int64_t window,
                              const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor gap =
      (at::arange(T, opts) + pos0).unsqueeze(1) - at::arange(S, opts).unsqueeze(0);
  at::Tensor allowed = gap.ge(0);
  if (window > 0) allowed = allowed.logical_and(gap.lt(window));
  return allowed;
}

// Where a query may look, bool [B, 1, T, T]: earlier or same tokens of its own
// example, and with window > 0 only the `window` latest of them.
inline at::Tensor packed_causal_mask(const at::Tensor& positions, int64_t window = 0) {
  const int64_t T = positions.size(-1);
  const at::Tensor allowed = causal_mask(T, T, 0, window, positions.device());
  const at::Tensor example = packed_example_ids(positions);
  const at::Tensor same = example.unsqueeze(2).eq(example.unsqueeze(1));  // [B, T, T]
  return same.logical_and(allowed).unsqueeze(1);
}

}  // namespace tf_sdk
