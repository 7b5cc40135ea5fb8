// RMSNorm as the reference computes it (transformers' LlamaRMSNorm, Gemma's
// with 1 + w): in fp32, then back to the activations' dtype. Autograd on
// those ops keeps the fp32 copy of a 16-bit input for backward (4 bytes a
// value, where the input itself is 2); at long context that copy is a large
// part of a recomputed block (two norms of an 8B-wide block: 32 KiB a
// token), and in backward its fp32 gradients (about six fp32 tensors the
// input's size) were a block's peak. rms_norm keeps the 16-bit input instead
// and computes the fp32 ops again in backward under autograd, a few thousand
// rows at a time: the same ops on the same values, so the same output and the
// same gradients, bit for bit, for the memory of the input alone (fused
// RMSNorm kernels such as Liger's keep the input and the inverse RMS for the
// same reason).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstdint>

namespace tf_sdk {

// y = w * (x / rms(x)) in fp32, cast back to x's dtype (Llama), or with
// unit_offset (Gemma) (x / rms(x)) * (1 + w) in fp32, then cast.
inline at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& w, double eps,
                                     bool unit_offset) {
  const at::ScalarType dtype = x.scalar_type();
  at::Tensor xf = dtype == at::kFloat ? x : x.to(at::kFloat);
  xf = xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps);
  if (unit_offset) {
    const at::Tensor scale = 1.0 + (w.scalar_type() == at::kFloat ? w : w.to(at::kFloat));
    const at::Tensor y = xf * scale;
    return y.scalar_type() == dtype ? y : y.to(dtype);
  }
  return w * (dtype == at::kFloat ? xf : xf.to(dtype));
}

// The rows rms_norm's backward computes again at once, and their workspace:
// the fp32 copies and their gradients, about six fp32 tensors the rows'
// size (for a plan: it does not grow past 8 MiB of fp32 rows, whatever the
// sequence).
inline int64_t rms_norm_backward_rows(int64_t width) {
  return std::max<int64_t>(64, (int64_t{8} << 20) / (4 * std::max<int64_t>(width, 1)));
}
inline int64_t rms_norm_backward_workspace_bytes(int64_t rows, int64_t width) {
  return 6 * 4 * width * std::min(rows, rms_norm_backward_rows(width));
}

namespace detail {

struct RmsNormKeepingInput : public torch::autograd::Function<RmsNormKeepingInput> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, double eps, bool unit_offset) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["unit_offset"] = unit_offset;
    return rms_norm_reference(x, w, eps, unit_offset);
  }

  // Each row's gradient depends on that row alone: computed again a few
  // rows at a time, where all at once the fp32 copies and their gradients
  // (about six fp32 tensors the input's size) were the long-context peak of
  // a block's backward.
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const double eps = ctx->saved_data["eps"].toDouble();
    const bool unit_offset = ctx->saved_data["unit_offset"].toBool();
    const at::Tensor w = saved[1].detach();
    const int64_t C = saved[0].size(-1), rows = saved[0].numel() / std::max<int64_t>(C, 1);
    const at::Tensor xr = saved[0].detach().reshape({rows, C});
    const at::Tensor gr = grads[0].reshape({rows, C});
    at::Tensor gx = at::empty_like(xr);
    const int64_t chunk = rms_norm_backward_rows(C);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      const at::Tensor xc = xr.narrow(0, r0, n).detach().requires_grad_(true);
      const at::AutoGradMode grad_on(true);
      const at::Tensor y = rms_norm_reference(xc, w, eps, unit_offset);
      gx.narrow(0, r0, n).copy_(torch::autograd::grad({y}, {xc}, {gr.narrow(0, r0, n)})[0]);
    }
    return {gx.view(saved[0].sizes()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace detail

// rms_norm_reference's output and gradients. With a frozen weight (LoRA,
// QLoRA), a 16-bit input that a gradient flows through is kept as it is,
// not as its fp32 copy (an fp32 one is its own copy: nothing to save
// there). A trained weight's gradient sums over every row: that case keeps
// the reference's autograd.
inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                           bool unit_offset = false) {
  if (x.scalar_type() == at::kFloat || !at::GradMode::is_enabled() || !x.requires_grad() ||
      w.requires_grad())
    return rms_norm_reference(x, w, eps, unit_offset);
  return detail::RmsNormKeepingInput::apply(x, w, eps, unit_offset);
}

}  // namespace tf_sdk
