// The update step: the optimizer, gradients applied by it or by a strategy
// that keeps the state itself, fp16 loss scaling undone, clipping (held
// gradients included), micro-batches, and non-finite steps found and named.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "executor.hpp"
#include "optimizer.hpp"
#include "param_store.hpp"
#include "plugin_set.hpp"

namespace tightfit {

class UpdateStep {
 public:
  using Log = std::function<void(tf_log_level, const std::string&)>;
  // `step` is the trainer's counter and `step_metrics` its record of the
  // step (grad_norm goes there); `log` the session's log.
  UpdateStep(PluginSet& plugins, ParamStore& store, Executor& executor, const int64_t& step,
             std::map<std::string, double>& step_metrics, Log log)
      : plugins_(plugins),
        store_(store),
        executor_(executor),
        step_(step),
        step_metrics_(step_metrics),
        log_(std::move(log)) {}
  UpdateStep(const UpdateStep&) = delete;
  UpdateStep& operator=(const UpdateStep&) = delete;

  // Made before parameters exist (it holds no state yet), so that a dry run
  // can ask for its estimates.
  void create_optimizer(const OptimizerConfig& config) {
    optimizer_ = std::make_unique<Optimizer>(config);
  }
  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }

  void zero_grad();
  // TF_ERR_NON_FINITE (with non_finite() saying where) when gradients are not finite.
  tf_status optimizer_step();
  // Optimizer-in-backward: updates one parameter now, as the coming optimizer
  // step will count it.
  void optimizer_apply(const std::string& name, const at::Tensor& grad, double grad_scale);
  // The 1-based number of the optimizer step an update made now counts as:
  // the one being taken inside optimizer_step, the coming one in backward;
  // while one parameter is being updated, that parameter's own count.
  int64_t update_step() const;
  // torch's AdamW counts each parameter's own updates (its state's "step",
  // which the bias corrections use): a parameter without a gradient in a
  // step (an expert no token chose) is not updated, and its count stays.
  // The count an update of `name` made now takes; marks it updated in this
  // step.
  int64_t take_param_step(const std::string& name);
  // The steps each parameter sat out (only those that did), for checkpoints.
  const std::map<std::string, int64_t>& steps_sat_out() const { return sat_out_; }
  void set_steps_sat_out(std::map<std::string, int64_t> sat_out) { sat_out_ = std::move(sat_out); }
  // Gradient accumulation: the coming backward passes are micro-batch `index`
  // of `count` (reset to 0 of 1 by optimizer_step).
  void set_micro_batch(int32_t index, int32_t count);
  int32_t micro_batch_index() const { return micro_index_; }
  int32_t micro_batch_count() const { return micro_count_; }

  // What the last non-finite update found; empty when none since clear.
  const std::string& non_finite() const { return non_finite_; }
  void clear_non_finite() { non_finite_.clear(); }

 private:
  // One parameter's update: a strategy's optimizer_step_param or the kernel's,
  // with the parameter's own step count.
  void update_param(Param& p, const at::Tensor& grad);
  // Offers one parameter's update (take_param_step taken) to the
  // strategies' optimizer_step_param; whether one took it.
  bool offer_to_strategies(Param& p, const at::Tensor& grad);
  // After a step's updates: each of `params` not updated in it sat it out.
  void count_steps_sat_out(const std::vector<Param*>& params);
  // The finiteness of each step's unscaled gradients, reported to the
  // strategies that scale the loss.
  void report_loss_scale(bool finite);

  PluginSet& plugins_;
  ParamStore& store_;
  Executor& executor_;
  const int64_t& step_;
  std::map<std::string, double>& step_metrics_;
  Log log_;

  std::unique_ptr<Optimizer> optimizer_;
  int32_t micro_index_ = 0, micro_count_ = 1;
  bool in_optimizer_step_ = false;
  // [optimizer] fused with every parameter a strategy's: fused launches at
  // the last step's end, and whether that was said.
  int64_t fused_seen_ = 0;
  bool warned_fused_unused_ = false;
  std::string non_finite_;
  // The run's count (update_step's rule), and `name`'s: the run's less the
  // steps it sat out.
  int64_t run_step() const;
  int64_t param_step(const std::string& name) const;

  std::map<std::string, int64_t> sat_out_;  // steps a parameter was not updated in
  std::set<std::string> updated_;           // parameters updated in the coming step
  const std::string* updating_ = nullptr;   // the parameter update_param is updating
};

}  // namespace tightfit
