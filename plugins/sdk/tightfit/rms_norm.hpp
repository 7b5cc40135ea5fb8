// RMSNorm as the reference computes it (transformers' LlamaRMSNorm, Gemma's
// with 1 + w): in fp32, then back to the activations' dtype. Autograd on
// those ops keeps the fp32 copy of a 16-bit input for backward (4 bytes a
// value, where the input itself is 2); at long context that copy is a large
// part of a recomputed block (two norms of an 8B-wide block: 32 KiB a
// token). rms_norm keeps the 16-bit input instead and computes the fp32 ops
// again in backward under autograd: the same ops on the same values, so the
// same output and the same gradients, bit for bit, for the memory of the
// input alone (fused RMSNorm kernels such as Liger's keep the input and
// the inverse RMS for the same reason).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

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

namespace detail {

struct RmsNormKeepingInput : public torch::autograd::Function<RmsNormKeepingInput> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, double eps, bool unit_offset) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["unit_offset"] = unit_offset;
    return rms_norm_reference(x, w, eps, unit_offset);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const at::Tensor x = saved[0].detach().requires_grad_(want_x);
    const at::Tensor w = saved[1].detach().requires_grad_(want_w);
    torch::autograd::variable_list inputs;
    if (want_x) inputs.push_back(x);
    if (want_w) inputs.push_back(w);
    torch::autograd::variable_list got;
    {
      const at::AutoGradMode grad_on(true);
      const at::Tensor y = rms_norm_reference(x, w, ctx->saved_data["eps"].toDouble(),
                                              ctx->saved_data["unit_offset"].toBool());
      got = torch::autograd::grad({y}, inputs, {grads[0]});
    }
    size_t i = 0;
    const at::Tensor gx = want_x ? got[i++] : at::Tensor();
    const at::Tensor gw = want_w ? got[i++] : at::Tensor();
    return {gx, gw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace detail

// rms_norm_reference's output and gradients; a 16-bit input that a gradient
// flows through is kept as it is, not as its fp32 copy (an fp32 one is its
// own copy: nothing to save there).
inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                           bool unit_offset = false) {
  if (x.scalar_type() == at::kFloat || !at::GradMode::is_enabled() ||
      !(x.requires_grad() || w.requires_grad()))
    return rms_norm_reference(x, w, eps, unit_offset);
  return detail::RmsNormKeepingInput::apply(x, w, eps, unit_offset);
}

// The bytes a value of a norm's input costs for backward: its fp32 copy (an
// fp32 input is the copy), or the 16-bit input itself (rms_norm).
inline int64_t rms_norm_kept_bytes(int64_t activation_bytes) {
  return activation_bytes == 4 ? 4 : activation_bytes;
}

}  // namespace tf_sdk
