// A preference schedule's pass: each row's summed target log-probability,
// and the backward of a weighted sum of them (Executor::sequence_logps).
#include "executor.hpp"
#include "ignore_index.hpp"
#include "memory_accounting.hpp"

namespace tightfit {

Executor::SequenceLogps Executor::sequence_logps(const at::Tensor& tokens_in,
                                                 const at::Tensor& targets_in,
                                                 const at::Tensor& positions_in,
                                                 const at::Tensor& grad_weights) {
  const bool backward = grad_weights.defined();
  if (tokens_in.dim() != 2 || targets_in.sizes() != tokens_in.sizes())
    throw std::invalid_argument("sequence_logps: tokens and targets must be int64 [B, T]");
  const int64_t B = tokens_in.size(0), T = tokens_in.size(1);
  if (backward && (grad_weights.dim() != 1 || grad_weights.size(0) != B))
    throw std::invalid_argument("sequence_logps: grad_weights must hold one weight per row (" +
                                std::to_string(B) + "), not " +
                                std::to_string(grad_weights.numel()));
  const at::Tensor tokens = tokens_in.to(env_.device);
  const at::Tensor positions = positions_in.defined() ? positions_in.to(env_.device) : positions_in;
  const ScopedAssign<at::Tensor> pass(pass_positions_, positions);
  const ScopedAssign<int32_t> head(fused_head_, fusable_head());
  const double strategies_scale = backward ? strategies_loss_scale() : 1.0;
  LossRequest request{targets_in, strategies_scale};
  {
    CategoryScope scope(TF_MEM_ACTIVATIONS);
    request.each = at::zeros({B * T}, at::TensorOptions().dtype(at::kFloat).device(env_.device));
    // logp_b = -sum_t CE_t over row b, so sum_b w_b logp_b = sum_t (-w_b(t)) CE_t.
    if (backward)
      request.weights =
          (-grad_weights.to(env_.device, at::kFloat)).unsqueeze(1).expand({B, T}).reshape({-1});
  }
  at::Tensor loss;
  {
    at::AutoGradMode mode(backward);
    loss = forward_stages(tokens, /*training=*/true, positions, &request);
    if (!request.computed) {
      request.each = request.each.to(loss.device());
      loss = weighted_logits_loss(loss, targets_in, request);
    }
  }
  SequenceLogps out;
  out.logps = (-request.each.view({B, T}).sum(1)).to(at::kCPU);
  out.counts = targets_in.ne(kIgnoreIndex).sum(1).to(at::kCPU, at::kLong);
  out.finite = out.logps.isfinite().all().item<bool>();
  if (backward) backward_pass(loss, 1.0, strategies_scale);
  return out;
}

}  // namespace tightfit
