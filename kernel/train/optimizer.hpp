// AdamW and SGD over the parameter store. State is keyed by parameter name so
// that strategies may place or compress it and checkpoints can save it.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "kernel_config.hpp"  // OptimizerConfig: the [optimizer] table
#include "param_store.hpp"
#include "pending_reads.hpp"

namespace tightfit {

class Optimizer {
 public:
  explicit Optimizer(OptimizerConfig cfg) : cfg_(std::move(cfg)), lr_(cfg_.lr) {}

  const OptimizerConfig& config() const { return cfg_; }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

  // Scales gradients so that their global L2 norm, together with gradients
  // strategies hold themselves (held_norm_sq, their squared norm), is at
  // most grad_clip. The norms are taken on the device, all parameters at
  // once (LibTorch's multi-tensor norm), and read by the host once: the
  // norm, NaN or infinite when a gradient is not finite, which is also the
  // step's finite flag. What `pending` holds (the step's losses) is read
  // in that same read. Returns the norm before and the factor applied.
  struct Clip {
    double norm = 0;
    double scale = 1;
  };
  Clip clip(const std::vector<Param*>& params, double held_norm_sq = 0,
            PendingReads* pending = nullptr);

  // Begins a step (bias corrections use the incremented count).
  void begin_step() { ++steps_; }
  // One parameter's update: its value (updated in place; a low-precision one
  // through an fp32 working copy), its gradient, its state (one fp32 tensor
  // shaped like the value per slot_names() entry, zero before the first
  // update, updated in place) and the step its bias corrections use.
  struct Item {
    at::Tensor value;
    bool decays = false;
    at::Tensor grad;
    std::vector<at::Tensor*> slots;
    int64_t step = 0;
  };
  // Updates the items with LibTorch's multi-tensor (_foreach_*) kernels, a
  // group of parameters per launch, bit for bit the update of each alone.
  // A group holds at most group_elements() elements, so its temporaries
  // (fp32 denominators; working copies of low-precision values) stay
  // within what the plan counts for the update.
  void update_many(const std::vector<Item>& items);
  // The elements of one group: the largest parameter's, or a 32nd of all
  // of them (at most 4M: 16 MiB of fp32 workspace) when that is more, so that
  // many small parameters (LoRA's adapters) take a few launches, not one
  // each. Low-precision values group by the largest alone: their fp32
  // working copies are planned as one parameter's (the precision plugin).
  static int64_t group_elements(int64_t largest, int64_t total, bool low);
  // The state slots of parameter `p` in state(), made (zero) on first use.
  std::vector<at::Tensor*> slots_of(const Param& p);
  // Updates one parameter in place from its gradient, with the bias
  // correction of step `step` (default: the current count), keeping its
  // state in state().
  void update(Param& p, const at::Tensor& grad, int64_t step = -1);
  // The same update with state the caller keeps (a strategy's tier).
  // `value` may be any tensor (a host copy).
  void update_with_state(const at::Tensor& value, bool decays, const at::Tensor& grad,
                         const std::vector<at::Tensor*>& slots, int64_t step);
  // AdamW: exp_avg, exp_avg_sq; SGD with momentum: momentum_buffer; else none.
  std::vector<std::string> slot_names() const;
  // Calls of the fused kernel so far ([optimizer] fused).
  int64_t fused_launches() const { return fused_launches_; }

  // State tensors by "<param>.<slot>" (exp_avg, exp_avg_sq, momentum_buffer).
  std::map<std::string, at::Tensor>& state() { return state_; }
  int64_t state_bytes() const;

 private:
  // update_many's items [begin, end), in one launch per operation.
  void update_group(const std::vector<Item>& items, size_t begin, size_t end);
  // [optimizer] fused: a group's AdamW in LibTorch's fused kernel
  // (_fused_adamw_, what torch.optim.AdamW(fused=True) calls), one pass over
  // each parameter instead of eight multi-tensor ones. Not bit for bit the
  // multi-tensor update: it lerps the first moment and divides sqrt(v) by
  // sqrt(1 - beta2^t) where the default takes sqrt(v / (1 - beta2^t)), each
  // a last-bit rounding.
  void fused_adamw(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                   const std::vector<at::Tensor>& m, const std::vector<at::Tensor>& v,
                   const std::vector<int64_t>& steps, const std::vector<size_t>& decaying);

  OptimizerConfig cfg_;
  double lr_;
  int64_t steps_ = 0;
  int64_t fused_launches_ = 0;
  std::map<std::string, at::Tensor> state_;
};

}  // namespace tightfit
