// The update step (update_step.hpp).
#include "update_step.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "host_reads.hpp"
#include "memory_accounting.hpp"
#include "plugin_hooks.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
void UpdateStep::optimizer_apply(const std::string& name, const at::Tensor& grad,
                                 double grad_scale) {
  Param& p = store_.get(name);
  if (!p.trainable) throw std::invalid_argument("parameter \"" + name + "\" is frozen");
  at::Tensor g = grad;
  if (grad_scale != 1.0) {
    CategoryScope transient(TF_MEM_TRANSIENT);
    g = grad * grad_scale;
  }
  CategoryScope scope(TF_MEM_OPTIMIZER);
  update_param(p, g);
}

int64_t UpdateStep::run_step() const {
  return in_optimizer_step_ ? optimizer_->steps() : optimizer_->steps() + 1;
}

int64_t UpdateStep::param_step(const std::string& name) const {
  const auto it = sat_out_.find(name);
  return it == sat_out_.end() ? run_step() : run_step() - it->second;
}

int64_t UpdateStep::update_step() const {
  return updating_ == nullptr ? run_step() : param_step(*updating_);
}

int64_t UpdateStep::take_param_step(const std::string& name) {
  updated_.insert(name);
  return param_step(name);
}

bool UpdateStep::offer_to_strategies(Param& p, const at::Tensor& grad) {
  // optimizer_info's step is this parameter's while a strategy updates it.
  updating_ = &p.name;
  struct Reset {
    const std::string*& slot;
    ~Reset() { slot = nullptr; }
  } reset{updating_};
  // Strategies that keep the state themselves (8-bit AdamW, offloaded state)
  // update where it lives.
  return StrategyChain(plugins_.strategies)
             .first_handled(TF_STRATEGY_HOOK(optimizer_step_param), p.name.c_str(),
                            borrow_handle(p.value), borrow_handle(grad), optimizer_->lr()) >= 0;
}

void UpdateStep::update_param(Param& p, const at::Tensor& grad) {
  const int64_t step = take_param_step(p.name);
  if (!offer_to_strategies(p, grad)) optimizer_->update(p, grad, step);
}

void UpdateStep::count_steps_sat_out(const std::vector<Param*>& params) {
  for (Param* p : params)
    if (updated_.count(p->name) == 0) ++sat_out_[p->name];
  updated_.clear();
}

void UpdateStep::zero_grad() {
  for (Param& p : store_.all())
    if (p.value.defined() && p.value.grad().defined()) p.value.mutable_grad() = at::Tensor();
  StrategyChain(plugins_.strategies).each(TF_STRATEGY_HOOK(drop_held_grads));
}

void UpdateStep::set_micro_batch(int32_t index, int32_t count) {
  if (count < 1 || index < 0 || index >= count)
    throw std::invalid_argument("micro-batch " + std::to_string(index) + " of " +
                                std::to_string(count) + ": need 0 <= index < count");
  micro_index_ = index;
  micro_count_ = count;
}

void UpdateStep::report_loss_scale(bool finite) {
  StrategyChain(plugins_.strategies)
      .each(TF_STRATEGY_HOOK(loss_scale_update), int32_t{finite ? 1 : 0});
}

tf_status UpdateStep::optimizer_step() {
  micro_index_ = 0;
  micro_count_ = 1;
  std::vector<Param*> params = store_.trainable();
  if (executor_.applied_loss_scale() != 1.0) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> grads;
    for (Param* p : params)
      if (p->value.grad().defined()) grads.push_back(p->value.grad());
    if (!grads.empty()) at::_foreach_div_(grads, executor_.applied_loss_scale());
  }
  const bool scaled = executor_.applied_loss_scale() != 1.0;
  executor_.clear_applied_loss_scale();
  // Gradients strategies hold themselves (ZeRO's reduce-scattered parts)
  // count in the norm, are clipped by the same factor and updated after.
  double held_sq = 0;
  StrategyChain(plugins_.strategies).each(TF_STRATEGY_HOOK(grad_norm_sq), &held_sq);
  // The one read of the step: the gradients' norm, and the losses of the
  // passes that deferred theirs.
  const Optimizer::Clip clip = optimizer_->clip(params, held_sq, &executor_.pending_reads());
  const double norm = clip.norm;
  step_metrics_["grad_norm"] = norm;
  if (!std::isfinite(norm)) {
    // Name the parameters whose gradients went bad before they are dropped.
    std::vector<std::string> bad;
    {
      at::NoGradGuard no_grad;
      std::vector<Param*> with_grads;
      std::vector<at::Tensor> finite;  // one flag per gradient, read together
      for (Param* p : params)
        if (p->value.grad().defined()) {
          with_grads.push_back(p);
          finite.push_back(p->value.grad().isfinite().all());
          if (finite.back().device() != finite.front().device())  // stages on several devices
            finite.back() = finite.back().to(finite.front().device());
        }
      if (!finite.empty()) {
        const std::vector<double> flags = read_values(at::stack(finite));
        for (size_t i = 0; i < flags.size(); ++i)
          if (flags[i] == 0) bad.push_back(with_grads[i]->name);
      }
    }
    std::string where;
    for (size_t i = 0; i < std::min<size_t>(bad.size(), 3); ++i) where += (i ? ", " : "") + bad[i];
    if (bad.size() > 3) where += " and " + std::to_string(bad.size() - 3) + " more";
    non_finite_ = "step " + std::to_string(step_) + ": non-finite gradient" +
                  (bad.empty() ? std::string(" (held by a strategy)")
                               : " in " + std::to_string(bad.size()) + " of " +
                                     std::to_string(params.size()) + " parameters: " + where);
    log_(TF_LOG_WARN, non_finite_);
    updated_.clear();  // the step is not taken: no count moves
    zero_grad();
    if (scaled) report_loss_scale(false);
    return TF_ERR_NON_FINITE;
  }
  if (scaled) report_loss_scale(true);
  CategoryScope scope(TF_MEM_OPTIMIZER);
  optimizer_->begin_step();
  in_optimizer_step_ = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{in_optimizer_step_};
  // What no strategy updates goes to the optimizer together: a group of
  // parameters per launch instead of one.
  std::vector<Optimizer::Item> items;
  for (Param* p : params) {
    const at::Tensor& g = p->value.grad();
    if (!g.defined()) continue;
    const int64_t step = take_param_step(p->name);
    if (!offer_to_strategies(*p, g))
      items.push_back({p->value, p->decays(), g, optimizer_->slots_of(*p), step});
  }
  optimizer_->update_many(items);
  StrategyChain(plugins_.strategies).each(TF_STRATEGY_HOOK(apply_held_grads), clip.scale);
  // (Since the last step's end: fused_update's updates run in the
  // backward, ZeRO's held parts after the rest.)
  if (optimizer_->config().fused && optimizer_->fused_launches() == fused_seen_ &&
      !params.empty() && !warned_fused_unused_) {
    warned_fused_unused_ = true;
    log_(TF_LOG_WARN,
         "[optimizer] fused = true updates nothing in this run: the strategies update every "
         "trained parameter themselves (8-bit AdamW keeps its own state); drop the key");
  }
  fused_seen_ = optimizer_->fused_launches();
  count_steps_sat_out(params);
  return TF_OK;
}

}  // namespace tightfit
