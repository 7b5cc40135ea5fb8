// A preference schedule's pass: each target's log-probability (or each
// row's sum), and the backward of a weighted sum of them
// (Executor::token_logps, Executor::sequence_logps).
#include "executor.hpp"
#include "ignore_index.hpp"
#include "memory_accounting.hpp"

namespace tightfit {

Executor::TokenLogps Executor::token_logps(const at::Tensor& tokens_in,
                                           const at::Tensor& targets_in,
                                           const at::Tensor& positions_in,
                                           const at::Tensor& grad_weights) {
  const bool backward = grad_weights.defined();
  if (tokens_in.dim() != 2 || targets_in.sizes() != tokens_in.sizes() ||
      targets_in.scalar_type() != at::kLong)
    throw std::invalid_argument("token_logps: tokens and targets must be int64 [B, T] alike");
  const int64_t B = tokens_in.size(0), T = tokens_in.size(1);
  if (backward && grad_weights.sizes() != tokens_in.sizes())
    throw std::invalid_argument("token_logps: grad_weights must hold one weight per token [" +
                                std::to_string(B) + ", " + std::to_string(T) + "], not " +
                                std::to_string(grad_weights.numel()) + " values");
  check_target_ids(targets_in);
  // Rows without a target (KTO's KL rows in its backward, whose targets it
  // masks) score 0 whatever the model says: they are left out of the pass.
  // One row always runs, so that a backward reaches the strategies.
  const at::Tensor active = targets_in.ne(kIgnoreIndex).any(1).to(at::kCPU);
  if (const int64_t n_active = active.sum().item<int64_t>(); n_active < B && B > 1) {
    const at::Tensor rows = n_active > 0 ? active.nonzero().squeeze(1) : at::zeros({1}, at::kLong);
    auto pick = [&](const at::Tensor& t) {
      return t.defined() ? t.index_select(0, rows.to(t.device())) : t;
    };
    const TokenLogps part =
        token_logps(pick(tokens_in), pick(targets_in), pick(positions_in), pick(grad_weights));
    TokenLogps out;
    out.logps = at::zeros({B, T}, at::kFloat).index_copy_(0, rows, part.logps);
    out.finite = part.finite;
    return out;
  }
  const at::Tensor tokens = tokens_in.to(env_.device);
  const at::Tensor positions = positions_in.defined() ? positions_in.to(env_.device) : positions_in;
  const ScopedAssign<PassRows> pass(pass_rows_, PassRows(positions));
  const ScopedAssign<const char*> no_terms(terms_refused_by_, "sequence_logps/token_logps");
  const ScopedAssign<int32_t> head(fused_head_, fusable_head());
  const double strategies_scale = backward ? strategies_loss_scale() : 1.0;
  LossRequest request{targets_in, strategies_scale};
  {
    CategoryScope scope(TF_MEM_ACTIVATIONS);
    request.each = at::zeros({B * T}, at::TensorOptions().dtype(at::kFloat).device(env_.device));
    // logp_t = -CE_t, so sum_t w_t logp_t = sum_t (-w_t) CE_t.
    if (backward) request.weights = (-grad_weights.to(env_.device, at::kFloat)).reshape({-1});
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
  TokenLogps out;
  out.logps = (-request.each.view({B, T})).to(at::kCPU);
  out.finite = out.logps.isfinite().all().item<bool>();
  if (backward) backward_pass(loss, 1.0, strategies_scale);
  return out;
}

void Executor::check_target_ids(const at::Tensor& targets) const {
  if (targets.numel() == 0) return;
  const at::Tensor ids = at::where(targets.ne(kIgnoreIndex), targets, 0);
  const int64_t lowest = ids.min().item<int64_t>(), highest = ids.max().item<int64_t>();
  // The last head the pass reaches says how many rows its projection has.
  int64_t rows = -1;
  for (size_t i = stages_.size(); i-- > 0;) {
    const StageState& st = stages_[i];
    if (st.skip) continue;
    if (st.kind == TF_STAGE_HEAD && !st.projection_weight.empty()) {
      const Param* w = store_.find(st.projection_weight);
      if (w != nullptr && !w->shape.empty()) rows = w->shape[0];
    }
    break;
  }
  if (lowest < 0 || (rows >= 0 && highest >= rows))
    throw std::invalid_argument("a target id " + std::to_string(lowest < 0 ? lowest : highest) +
                                " is neither ignore_index (" + std::to_string(kIgnoreIndex) +
                                ") nor a token of the " +
                                (rows >= 0 ? std::to_string(rows) + "-token " : std::string()) +
                                "vocabulary: a schedule's own targets must be one or the other");
}

Executor::SequenceLogps Executor::sequence_logps(const at::Tensor& tokens,
                                                 const at::Tensor& targets,
                                                 const at::Tensor& positions,
                                                 const at::Tensor& grad_weights) {
  if (tokens.dim() != 2)
    throw std::invalid_argument("sequence_logps: tokens and targets must be int64 [B, T]");
  const int64_t B = tokens.size(0), T = tokens.size(1);
  if (grad_weights.defined() && (grad_weights.dim() != 1 || grad_weights.size(0) != B))
    throw std::invalid_argument("sequence_logps: grad_weights must hold one weight per row (" +
                                std::to_string(B) + "), not " +
                                std::to_string(grad_weights.numel()));
  // Every target of row b weighs grad_weights[b].
  const at::Tensor per_token = grad_weights.defined()
                                   ? grad_weights.to(at::kFloat).unsqueeze(1).expand({B, T})
                                   : at::Tensor();
  const TokenLogps each = token_logps(tokens, targets, positions, per_token);
  SequenceLogps out;
  out.logps = each.logps.sum(1);
  out.counts = targets.ne(kIgnoreIndex).sum(1).to(at::kCPU, at::kLong);
  out.finite = each.finite;
  return out;
}

}  // namespace tightfit
