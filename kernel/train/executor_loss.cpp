// The executor's loss: a pass's mean cross-entropy, with the head's
// projection fused into it (fused_head_loss.hpp) where the head declares its
// projection and no strategy changes it, else from the whole logits.
#include <cstdint>

#include "cross_entropy.hpp"
#include "executor.hpp"
#include "fused_head_loss.hpp"
#include "host_reads.hpp"
#include "logging.hpp"
#include "memory_accounting.hpp"
#include "plugin_hooks.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {

int32_t Executor::fusable_head() const {
  if (!fused_loss_ || (adapters_enabled_ && head_extended_.value_or(false))) return -1;
  for (size_t i = stages_.size(); i-- > 0;) {
    const StageState& st = stages_[i];
    if (st.skip) continue;
    return st.kind == TF_STAGE_HEAD && !st.projection_weight.empty() ? static_cast<int32_t>(i) : -1;
  }
  return -1;
}

at::Tensor Executor::forward_loss(const at::Tensor& tokens, const at::Tensor& targets,
                                  bool training, const PassRows& rows, double grad_scale) {
  // A pass (run_pass) has chosen the head already, for its backward too.
  std::vector<at::Tensor> terms;
  PassScope pass = *pass_;
  if (pass.fused_head < 0) pass.fused_head = fusable_head();
  pass.terms = &terms;
  const EnteredPass entered(*this, pass);
  LossRequest request{targets, grad_scale};
  // A batch's targets come from the host: counted there, never read back.
  if (targets.device().is_cpu()) request.counted = count_not_equal(targets, kIgnoreIndex);
  const at::Tensor out = forward_stages(tokens.to(env_.device), training, rows, &request);
  CategoryScope scope(TF_MEM_ACTIVATIONS);
  at::Tensor loss = request.computed ? out
                                     : cross_entropy_mean(
                                           out.reshape({-1, out.size(-1)}).to(at::kFloat),
                                           targets.to(out.device()).reshape({-1}), request.counted);
  // The model's own terms (a mixture of experts' load-balancing loss) are
  // the loss's: reported and back-propagated with it.
  for (const at::Tensor& t : terms) loss = loss + t.to(loss.device(), loss.scalar_type());
  return loss;
}

void Executor::add_loss_term(const at::Tensor& term) {
  if (!term.is_floating_point() || term.numel() != 1)
    throw std::invalid_argument("add_loss_term: the term must be a float scalar, not a tensor of " +
                                std::to_string(term.numel()) + " values");
  if (pass_->recompute_terms != nullptr) {  // a checkpointed stage's: only its gradient is new
    pass_->recompute_terms->push_back(term.reshape({}));
    return;
  }
  if (pass_->terms_refused_by != nullptr)
    throw std::invalid_argument(
        std::string("model plugin \"") + plugins_.model.plugin->name +
        "\" added a term to the loss (a mixture of experts' load-balancing loss) in a pass of " +
        pass_->terms_refused_by +
        " that does not take it (ABI 1.18's take_loss_terms): its schedule computes its own "
        "loss and leaves the term out of these passes, as one built before 1.18 must, and as "
        "the paired schedules do with concatenate_pairs = false (TRL adds the term of the "
        "concatenated pass, which one side's passes after the other's do not add up to): see "
        "the schedule's README, or turn the term off in the model (output_router_logits = "
        "false in its config.json)");
  if (pass_->terms == nullptr) return;  // no loss in this pass (logits, generation)
  if (!pass_->rows.padding_known)
    throw std::invalid_argument(
        std::string("model plugin \"") + plugins_.model.plugin->name +
        "\" added a term to the loss that counts tokens, and this batch came from a schedule "
        "whose tf_batch (ABI before 1.16) cannot say which tokens pad their rows: rebuild the "
        "schedule against this tightfit's plugin_api.h, or turn the term off in the model "
        "(output_router_logits = false)");
  pass_->terms->push_back(term.reshape({}));
}

at::Tensor Executor::head_loss(int32_t stage, const at::Tensor& hidden, LossRequest& loss) {
  const StageState& st = stages_[static_cast<size_t>(stage)];
  PassScope in_head = *pass_;  // its projection comes to its device
  in_head.compute_device = at::Device(st.device);
  const EnteredPass entered(*this, in_head);
  CategoryScope scope(TF_MEM_ACTIVATIONS);
  loss.computed = true;
  HeadProjection projection;
  // With the adapters off nothing extends the head, and whether they do is
  // asked (once) while they are on.
  const bool extended = adapters_enabled_ && head_extended_.value_or(false);
  if (!extended) {
    projection.weight = fetch_weight(st.projection_weight);
    if (!head_extended_.has_value() && adapters_enabled_)
      head_extended_ = head_is_extended(st, hidden, projection.weight);
  }
  if (adapters_enabled_ && *head_extended_) {
    // The hidden state came: the projection as the head would have made it.
    projection = {};
    const at::Tensor targets = loss.targets.to(hidden.device());
    at::Tensor logits = linear(hidden, st.projection_weight, st.projection_bias);
    if (st.projection_softcap > 0)  // as the head caps its output
      logits = at::tanh(logits / st.projection_softcap) * st.projection_softcap;
    if (loss.each.defined()) return weighted_logits_loss(logits, targets, loss);
    if (loss.logits_scale != 1.0 || loss.entropies.defined())
      throw std::logic_error("a temperature or entropies belong to a weighted (log-probs) loss");
    return cross_entropy_mean(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                              targets.reshape({-1}), loss.counted);
  }
  if (!st.projection_bias.empty()) projection.bias = fetch_weight(st.projection_bias);
  projection.softcap = st.projection_softcap;
  const int64_t chunk = fused_loss_chunk_rows(projection.weight.size(0), loss_chunk_tokens_);
  // The targets as the host has them: the rows that count are picked there
  // (the fused loss brings them to the device).
  if (loss.each.defined())
    return fused_head_weighted_loss(hidden, loss.targets, projection, chunk, loss.grad_scale,
                                    loss.weights, loss.each, loss.mean_logits, loss.logits_scale,
                                    loss.entropies);
  return fused_head_loss(hidden, loss.targets, projection, chunk, loss.grad_scale, loss.counted);
}

at::Tensor Executor::weighted_logits_loss(const at::Tensor& logits, const at::Tensor& targets,
                                          LossRequest& loss) {
  CategoryScope scope(TF_MEM_ACTIVATIONS);
  const at::Tensor t = targets.to(logits.device()).reshape({-1});
  at::Tensor scaled = logits.reshape({-1, logits.size(-1)}).to(at::kFloat);
  if (loss.logits_scale != 1.0) scaled = scaled * loss.logits_scale;
  const at::Tensor lp = at::log_softmax(scaled, -1);
  const at::Tensor counted = t.ne(kIgnoreIndex).to(at::kFloat);
  if (loss.entropies.defined())
    loss.entropies.copy_(-(lp.detach().exp() * lp.detach()).sum(1) * counted);
  // A head without a declared projection: its logits say the vocabulary.
  if (const int64_t highest = t.numel() > 0 ? static_cast<int64_t>(read_value(t.max())) : -1;
      highest >= logits.size(-1))
    throw std::invalid_argument("a target id " + std::to_string(highest) + " is past the head's " +
                                std::to_string(logits.size(-1)) + "-token vocabulary");
  const at::Tensor ce = -lp.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1) * counted;
  loss.each.copy_(ce.detach());
  if (loss.mean_logits.defined())
    loss.mean_logits.copy_(logits.detach().reshape({-1, logits.size(-1)}).to(at::kFloat).mean(1));
  loss.computed = true;
  if (!loss.weights.defined()) return ce.detach().sum();
  return (ce * loss.weights.to(ce.device())).sum();
}

bool Executor::head_is_extended(const StageState& head, const at::Tensor& hidden,
                                const at::Tensor& w) {
  const bool any = std::any_of(
      plugins_.strategies.begin(), plugins_.strategies.end(),
      [](const PluginInstance& s) { return s.plugin->strategy()->linear_extend != nullptr; });
  if (!any) return false;
  // One token's projection, offered to linear_extend as linear offers it.
  at::NoGradGuard no_grad;
  const at::Tensor x = hidden.reshape({-1, hidden.size(-1)}).narrow(0, 0, 1);
  at::Tensor y = at::linear(x.to(w.scalar_type()), w);
  const at::Tensor plain = y;
  StrategyChain(plugins_.strategies)
      .thread_tensor(TF_STRATEGY_HOOK(linear_extend), y, head.projection_weight.c_str(),
                     borrow_handle(x));
  if (y.is_same(plain)) return false;
  log_message(TF_LOG_INFO, "a strategy extends the head's projection " + head.projection_weight +
                               " (LoRA on the head): the loss takes the logits whole, not in "
                               "chunks ([run] fused_loss)");
  return true;
}

}  // namespace tightfit
