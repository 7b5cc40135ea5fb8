// The stage executor: runs the model as the sequence of stages it declared,
// raises the strategies' hook events around each stage in forward, backward
// and recompute, hands finished gradients to grad_ready, and serves weights
// (fetch_weight, linear) from whichever tier a strategy keeps them in.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "param_store.hpp"
#include "plugin_set.hpp"
#include "run_environment.hpp"

namespace tightfit {

struct StageState {
  std::string name;
  tf_stage_kind kind = TF_STAGE_BLOCK;
  bool recompute = false;
  bool skip = false;
  bool trainable = true;
  std::string device;
  int64_t activation_bytes_per_token = 0;
  int64_t flops_per_token = 0;
  int64_t frozen_activation_bytes_per_token = 0;  // 0 = unknown
  int64_t output_bytes_per_token = 0;             // 0 = unknown
  int64_t backward_bytes_per_token = 0;           // 0 = unknown
  int64_t frozen_backward_bytes_per_token = 0;    // 0 = unknown
};

struct PassResult {
  double loss = 0;
  int64_t n_tokens = 0;
  bool finite = true;
};

class Executor {
 public:
  // `step` is the trainer's counter (0-based), read for each call's tf_stage_call.
  Executor(PluginSet& plugins, ParamStore& store, const RunEnvironment& env, const int64_t& step)
      : plugins_(plugins), store_(store), env_(env), step_(step) {}
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The model's stages, in order, as it declared them and strategies marked them.
  std::vector<StageState>& stages() { return stages_; }
  const std::vector<StageState>& stages() const { return stages_; }
  // Once parameters exist: the tensor that gives checkpointed stages a backward.
  void prepare_recompute() {
    recompute_anchor_ =
        at::empty({0}, at::TensorOptions().device(env_.device)).requires_grad_(true);
  }
  // Testing aid ([run] debug_nan_at_steps): a NaN loss at each listed step, once.
  void inject_nan_at(const std::vector<int64_t>& steps) {
    nan_steps_pending_.insert(steps.begin(), steps.end());
  }

  // `positions` (int64 [B, T], optional): packed rows' per-token positions,
  // handed to every stage of the pass (the model must declare
  // TF_MODEL_FEATURE_POSITIONS).
  at::Tensor forward_logits(const at::Tensor& tokens, bool training,
                            const at::Tensor& positions = {});
  // Forward, loss and (when `backward`) backward with the loss scaled by
  // `loss_scale` times the strategies' fp16 factor; grad_ready is dispatched
  // as each stage's gradients finish.
  PassResult run_pass(const at::Tensor& tokens, const at::Tensor& targets, bool backward,
                      double loss_scale, const at::Tensor& positions = {});
  at::Tensor run_stage(int32_t stage, const at::Tensor& input, bool training, bool recompute);
  void raise_stage_event(int32_t stage, tf_pass_phase phase, bool begin);
  // Activation offload of a recomputed stage's input: the index of the
  // strategy that packed it (-1: none, keep it) and its key; and the way back.
  int32_t pack_activation(int32_t stage, const at::Tensor& x, uint64_t* key);
  at::Tensor unpack_activation(int32_t strategy, int32_t stage, uint64_t key);
  // Hands the finished gradients of `stage` (-1: all the rest) to strategies'
  // grad_ready hooks during backward.
  void dispatch_grads(int32_t stage);

  at::Tensor fetch_weight(const std::string& name);
  at::Tensor fetch_resident(Param& p);
  // Runs fn with p in the device tier: a parameter a strategy keeps in
  // another tier is brought in around fn (TF_PHASE_ACCESS) unless its stage
  // is in use already.
  void with_resident(Param& p, const std::function<void()>& fn);
  bool stage_in_use(int32_t stage) const;  // fetch_weight once the weight is in the device tier
  at::Tensor linear(const at::Tensor& x, const std::string& weight, const std::string& bias);

  // fp16 loss scaling: the strategies' factor the last backward passes were
  // scaled by (1: none). The update step divides it out and resets it.
  double applied_loss_scale() const { return applied_loss_scale_; }
  void clear_applied_loss_scale() { applied_loss_scale_ = 1.0; }

 private:
  // The product of the strategies' loss_scale factors.
  double strategies_loss_scale();

  PluginSet& plugins_;
  ParamStore& store_;
  const RunEnvironment& env_;
  const int64_t& step_;

  std::vector<StageState> stages_;
  std::set<int64_t> nan_steps_pending_;
  double applied_loss_scale_ = 1.0;           // the loss scale of this step's backward passes
  std::vector<int> active_events_;            // per stage: stage events begun and not yet ended
  std::vector<bool> grads_dispatched_;        // per backward: grad_ready already called
  std::optional<at::Device> compute_device_;  // the running stage's, while one runs
  at::Tensor pass_positions_;    // packed rows' positions while a pass runs (backward included)
  at::Tensor recompute_anchor_;  // requires grad so checkpointed stages always get a backward
};

}  // namespace tightfit
