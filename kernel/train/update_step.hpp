// The update step: the optimizer, gradients applied by it or by a strategy
// that keeps the state itself, fp16 loss scaling undone, clipping (held
// gradients included), micro-batches, and non-finite steps found and named.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

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
  // the one being taken inside optimizer_step, the coming one in backward.
  int64_t update_step() const;
  // Gradient accumulation: the coming backward passes are micro-batch `index`
  // of `count` (reset to 0 of 1 by optimizer_step).
  void set_micro_batch(int32_t index, int32_t count);
  int32_t micro_batch_index() const { return micro_index_; }
  int32_t micro_batch_count() const { return micro_count_; }

  // What the last non-finite update found; empty when none since clear.
  const std::string& non_finite() const { return non_finite_; }
  void clear_non_finite() { non_finite_.clear(); }

 private:
  // One parameter's update: a strategy's optimizer_step_param or the kernel's.
  void update_param(Param& p, const at::Tensor& grad, int64_t step);
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
  std::string non_finite_;
};

}  // namespace tightfit
