// AdamW and SGD over the parameter store. State is keyed by parameter name so
// that strategies may place or compress it and checkpoints can save it.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "kernel_config.hpp"  // OptimizerConfig: the [optimizer] table
#include "param_store.hpp"

namespace tightfit {

class Optimizer {
 public:
  explicit Optimizer(OptimizerConfig cfg) : cfg_(std::move(cfg)), lr_(cfg_.lr) {}

  const OptimizerConfig& config() const { return cfg_; }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

  // Global L2 norm of the gradients; NaN/Inf when any is not finite.
  static double grad_norm(const std::vector<Param*>& params);
  // Scales gradients so that their norm, together with gradients strategies
  // hold themselves (held_norm_sq, their squared norm), is at most
  // grad_clip. Returns the norm before and the factor applied.
  struct Clip {
    double norm = 0;
    double scale = 1;
  };
  Clip clip(const std::vector<Param*>& params, double held_norm_sq = 0);

  // Begins a step (bias corrections use the incremented count).
  void begin_step() { ++steps_; }
  // Updates one parameter in place from its gradient, with the bias
  // correction of step `step` (default: the current count), keeping its
  // state in state().
  void update(Param& p, const at::Tensor& grad, int64_t step = -1);
  // The same update with state the caller keeps (a strategy's tier): one fp32
  // tensor shaped like the parameter per slot_names() entry, zero before the
  // first update, updated in place. `value` may be any tensor (a host copy).
  void update_with_state(const at::Tensor& value, bool decays, const at::Tensor& grad,
                         const std::vector<at::Tensor*>& slots, int64_t step);
  // AdamW: exp_avg, exp_avg_sq; SGD with momentum: momentum_buffer; else none.
  std::vector<std::string> slot_names() const;

  // State tensors by "<param>.<slot>" (exp_avg, exp_avg_sq, momentum_buffer).
  std::map<std::string, at::Tensor>& state() { return state_; }
  int64_t state_bytes() const;

 private:
  OptimizerConfig cfg_;
  double lr_;
  int64_t steps_ = 0;
  std::map<std::string, at::Tensor> state_;
};

}  // namespace tightfit
