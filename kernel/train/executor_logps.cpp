// A preference schedule's pass: each target's log-probability (or each
// row's sum), and the backward of a weighted sum of them
// (Executor::token_logps, Executor::sequence_logps).
#include "executor.hpp"
#include "ignore_index.hpp"
#include "memory_accounting.hpp"

namespace tightfit {
namespace {

// A logps pass's rows, and what it runs of them.
struct FinalIds {
  at::Tensor tokens, targets, weights, mask;
};

// The rows with each one's final id (its last input's target) as one more
// input, attended to and routed, its own target ignored: [B, T + 1].
FinalIds with_final_ids(const at::Tensor& tokens, const at::Tensor& targets,
                        const at::Tensor& weights, const at::Tensor& mask,
                        const at::Tensor& positions) {
  if (positions.defined())
    throw std::invalid_argument(
        "a model's loss term over packed rows in a pass whose schedule computes its own loss: "
        "preference rows are not packed");
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const at::Tensor lengths =
      mask.defined() ? mask.to(at::kCPU).ne(0).sum(1) : at::full({B}, T, at::kLong);
  FinalIds r;
  r.tokens = at::cat({tokens.to(at::kCPU), at::zeros({B, 1}, at::kLong)}, 1);
  r.targets = at::cat({targets.to(at::kCPU), at::full({B, 1}, kIgnoreIndex, at::kLong)}, 1);
  r.mask = at::cat({mask.defined() ? mask.to(at::kCPU, at::kLong) : at::ones({B, T}, at::kLong),
                    at::zeros({B, 1}, at::kLong)},
                   1);
  if (weights.defined())
    r.weights = at::cat({weights.to(at::kCPU, at::kFloat), at::zeros({B, 1}, at::kFloat)}, 1);
  auto tok = r.tokens.accessor<int64_t, 2>();
  auto msk = r.mask.accessor<int64_t, 2>();
  const at::Tensor targets_cpu = targets.to(at::kCPU);
  const auto tgt = targets_cpu.accessor<int64_t, 2>();
  const auto len = lengths.accessor<int64_t, 1>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = len[b];
    if (n == 0) continue;
    const int64_t last = tgt[b][n - 1];
    if (last == kIgnoreIndex)
      throw std::invalid_argument(
          "row " + std::to_string(b) +
          "'s last input has no target, so its sequence's final id is not in the batch: a "
          "model's loss term cannot route it as TRL's forward does");
    tok[b][n] = last;
    msk[b][n] = 1;
  }
  return r;
}

}  // namespace

Executor::TokenLogps Executor::token_logps(const at::Tensor& tokens_in,
                                           const at::Tensor& targets_in,
                                           const at::Tensor& positions_in,
                                           const at::Tensor& grad_weights,
                                           const at::Tensor& attention_mask,
                                           const LossTermsTaken* terms_taken, bool padding_known,
                                           bool mean_logits, const TokenScoring& scoring) {
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
  if (attention_mask.defined() && attention_mask.sizes() != tokens_in.sizes())
    throw std::invalid_argument("token_logps: the attention mask must be [B, T] as the tokens");
  // Rows without a target (KTO's KL rows in its backward, whose targets it
  // masks) score 0 whatever the model says: they are left out of the pass
  // (and of the terms a model adds over its tokens). One row always runs,
  // so that a backward reaches the strategies.
  const at::Tensor active = targets_in.ne(kIgnoreIndex).any(1).to(at::kCPU);
  if (const int64_t n_active = active.sum().item<int64_t>(); n_active < B && B > 1) {
    const at::Tensor rows = n_active > 0 ? active.nonzero().squeeze(1) : at::zeros({1}, at::kLong);
    auto pick = [&](const at::Tensor& t) {
      return t.defined() ? t.index_select(0, rows.to(t.device())) : t;
    };
    const TokenLogps part =
        token_logps(pick(tokens_in), pick(targets_in), pick(positions_in), pick(grad_weights),
                    pick(attention_mask), terms_taken, padding_known, mean_logits, scoring);
    TokenLogps out;
    out.logps = at::zeros({B, T}, at::kFloat).index_copy_(0, rows, part.logps);
    if (mean_logits)
      out.mean_logits = at::zeros({B, T}, at::kFloat).index_copy_(0, rows, part.mean_logits);
    if (scoring.entropies)
      out.entropies = at::zeros({B, T}, at::kFloat).index_copy_(0, rows, part.entropies);
    out.finite = part.finite;
    return out;
  }
  // TRL's forward routes every id of each sequence, the last one too; a row
  // here feeds that one only as its last target. A pass that takes the
  // model's terms feeds it as one more input (its target ignored), so that
  // the routers see the tokens TRL's see, and the padding mask, so that
  // they leave the padding out; the log-probs are the same either way (the
  // padding follows every row's tokens, and no earlier position attends to
  // the final id), so a pass without terms runs the rows as they are.
  const FinalIds run = terms_taken ? with_final_ids(tokens_in, targets_in, grad_weights,
                                                    attention_mask, positions_in)
                                   : FinalIds{tokens_in, targets_in, grad_weights, {}};
  const int64_t Tr = run.tokens.size(1);
  const at::Tensor tokens = run.tokens.to(env_.device);
  const at::Tensor positions = positions_in.defined() ? positions_in.to(env_.device) : positions_in;
  PassRows rows(positions, run.mask.defined() ? run.mask.to(env_.device) : run.mask);
  rows.padding_known = padding_known;
  // The model's own terms: refused unless the schedule takes them.
  std::vector<at::Tensor> terms;
  PassScope pass = *pass_;
  pass.rows = rows;
  pass.terms_refused_by = terms_taken ? nullptr : "sequence_logps/token_logps";
  pass.terms = terms_taken ? &terms : nullptr;
  pass.fused_head = fusable_head();
  const EnteredPass entered(*this, pass);
  const double strategies_scale = backward ? strategies_loss_scale() : 1.0;
  LossRequest request{run.targets, strategies_scale};
  {
    CategoryScope scope(TF_MEM_ACTIVATIONS);
    request.each = at::zeros({B * Tr}, at::TensorOptions().dtype(at::kFloat).device(env_.device));
    // logp_t = -CE_t, so sum_t w_t logp_t = sum_t (-w_t) CE_t.
    if (backward) request.weights = (-run.weights.to(env_.device, at::kFloat)).reshape({-1});
    if (mean_logits) request.mean_logits = at::zeros_like(request.each);
    if (scoring.entropies) request.entropies = at::zeros_like(request.each);
    request.logits_scale = 1.0 / scoring.temperature;
  }
  at::Tensor loss;
  {
    at::AutoGradMode mode(backward);
    loss = forward_stages(tokens, /*training=*/true, rows, &request);
    if (!request.computed) {
      request.each = request.each.to(loss.device());
      if (request.mean_logits.defined())
        request.mean_logits = request.mean_logits.to(loss.device());
      if (request.entropies.defined()) request.entropies = request.entropies.to(loss.device());
      loss = weighted_logits_loss(loss, run.targets, request);
    }
  }
  TokenLogps out;
  out.logps = (-request.each.view({B, Tr})).narrow(1, 0, T).to(at::kCPU);
  if (mean_logits) out.mean_logits = request.mean_logits.view({B, Tr}).narrow(1, 0, T).to(at::kCPU);
  if (scoring.entropies)
    out.entropies = request.entropies.view({B, Tr}).narrow(1, 0, T).to(at::kCPU);
  out.finite = out.logps.isfinite().all().item<bool>();
  double weight = 0;
  if (terms_taken) {
    at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble));
    for (const at::Tensor& t : terms) sum = sum + t.detach().to(at::kCPU, at::kDouble);
    *terms_taken->sum = sum.item<double>();
    weight = terms_taken->grad_weight;
    if (backward && weight != 0)
      for (const at::Tensor& t : terms)
        loss = loss + weight * t.to(loss.device(), loss.scalar_type());
  }
  if (backward) {
    // A checkpointed stage's recomputed part of a term gets the same weight.
    pass.term_weight = weight;
    backward_pass(loss, 1.0, strategies_scale);
  }
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

Executor::SequenceLogps Executor::sequence_logps(
    const at::Tensor& tokens, const at::Tensor& targets, const at::Tensor& positions,
    const at::Tensor& grad_weights, const at::Tensor& attention_mask, const LossTermsTaken* terms,
    bool padding_known, bool mean_logits) {
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
  const TokenLogps each = token_logps(tokens, targets, positions, per_token, attention_mask, terms,
                                      padding_known, mean_logits);
  SequenceLogps out;
  out.mean_logits = each.mean_logits;
  out.logps = each.logps.sum(1);
  out.counts = targets.ne(kIgnoreIndex).sum(1).to(at::kCPU, at::kLong);
  out.finite = each.finite;
  return out;
}

}  // namespace tightfit
