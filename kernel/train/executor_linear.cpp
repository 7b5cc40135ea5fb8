// Linear layers of the stage executor: y = x W^T with W fetched from
// whichever tier and format a strategy keeps it in, and for a frozen weight
// stored compact or away the autograd Function that fetches it again in
// backward instead of keeping the dense copy.
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

#include "autocast_as.hpp"
#include "executor.hpp"
#include "plugin_hooks.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
namespace {

// The weight's dtype is the one a projection computes in (bf16 weights, a
// base dequantized to fp32): an input of another float type follows it, as
// PEFT and bitsandbytes cast to their compute dtype. Autocast casts anyway.
at::Tensor in_dtype_of(const at::Tensor& x, const at::Tensor& w) {
  if (x.scalar_type() == w.scalar_type() || !x.is_floating_point() || !w.is_floating_point())
    return x;
  return x.to(w.scalar_type());
}

// Autocast on in a reduced float dtype for a fetch in backward, where it is
// off: a compact weight decodes straight to the dtype it is used in there.
std::optional<AutocastAs> autocast_while_fetching(const at::Tensor& grad) {
  const at::DeviceType device = grad.device().type();
  if ((grad.scalar_type() != at::kBFloat16 && grad.scalar_type() != at::kHalf) ||
      at::autocast::is_autocast_enabled(device))
    return std::nullopt;
  return std::optional<AutocastAs>(std::in_place, device, true, grad.scalar_type());
}

// y = x W^T for a frozen weight stored compact: the dequantized W is fetched
// again in backward instead of being kept by autograd.
struct CompactLinear : public torch::autograd::Function<CompactLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            Executor* executor, const std::string& weight) {
    ctx->saved_data["executor"] = reinterpret_cast<int64_t>(executor);
    ctx->saved_data["weight"] = weight;
    const at::Tensor w = executor->fetch_weight(weight);
    return at::linear(in_dtype_of(x, w), w);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* executor = reinterpret_cast<Executor*>(ctx->saved_data["executor"].toInt());
    CategoryScope scope(TF_MEM_TRANSIENT);
    at::Tensor w;
    {
      // The weight in the gradient's dtype: under autocast of that dtype a
      // strategy may serve it so directly (fetch_weight), as in the forward.
      const std::optional<AutocastAs> autocast = autocast_while_fetching(grads[0]);
      w = executor->fetch_weight(ctx->saved_data["weight"].toStringRef());
    }
    return {grads[0].matmul(w.to(grads[0].device(), grads[0].scalar_type())), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor Executor::linear(const at::Tensor& x, const std::string& asked_weight,
                            const std::string& bias) {
  const std::string weight = read_name(asked_weight);
  const Param& p = store_.get(weight);
  at::Tensor b = bias.empty() ? at::Tensor() : fetch_weight(bias);
  at::Tensor y;
  // A frozen weight stored compact or in another tier is fetched again in
  // backward rather than kept by autograd.
  if ((p.format != TF_FORMAT_DENSE || p.residency != TF_TIER_DEVICE) && !p.trainable) {
    y = CompactLinear::apply(x, this, weight);
    if (b.defined()) y = y + b;
  } else {
    const at::Tensor w = fetch_weight(weight);
    y = at::linear(in_dtype_of(x, w), w, b.defined() ? in_dtype_of(b, w) : b);
  }
  StrategyChain(plugins_.strategies)
      .thread_tensor(TF_STRATEGY_HOOK(linear_extend), y, weight.c_str(), borrow_handle(x));
  return y;
}

}  // namespace tightfit
