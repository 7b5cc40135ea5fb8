// The memory planner: what a recipe's training step will hold, by category
// and tier, computed before anything is allocated (`tightfit plan`, and the
// prediction `tightfit run` prints next to what it measured).
//
// The kernel's baseline comes from what the recipe declared once every
// strategy has configured it: each parameter's shape, dtype, trainability and
// stage (adapters, frozen and skipped stages included), the stages' declared
// activation bytes per token, the optimizer's state per trainable value and
// the batch. Strategies and the schedule then add what the declarations do
// not show through their estimate_memory hooks (quantized formats, tiers,
// recomputation, gradients freed in backward, sharding). A strategy without
// the hook is named in the plan as unestimated rather than guessed at.
//
// The peak is the largest of the step's moments, each the sum of what is
// alive then: weights, adapters and optimizer state throughout; at the end
// of forward the activations every stage keeps; while a stage's backward
// runs, the activations of the stages before it, its own (recomputed ones
// rerun), its backward's workspace and the gradients of the stages done;
// at the update all gradients and the update's workspace; and for a schedule
// that samples, the generation (generation_plan.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "generation_plan.hpp"
#include "memory_accounting.hpp"
#include "plan_contribution.hpp"
#include "routed_reads.hpp"
#include "stage_flow.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

struct KernelParts;

struct MemoryPlan {
  // What the step holds at its peak, per tier and category (the device tier
  // is the run's device; on a CPU run host-tier bytes are in the same RAM).
  TierCounts at_peak{};
  CategoryCounts device_peak_by_category{};  // each category's own peak on the device
  int64_t device_peak = 0;                   // the device tier's peak
  int64_t tracked_peak = 0;  // what the run measures: on a CPU run the host tier is the same RAM
  int64_t host_bytes = 0, disk_bytes = 0;
  const char* peak_moment = "";  // "forward", "backward", "update", "generation"
  double time_factor = 1;        // predicted step time relative to the plain recipe
  // The share of a strategy's device activation delta (planned against every
  // stage's activations, as if none were recomputed) that the peak holds:
  // under checkpointing, one block's.
  double activation_share_at_peak = 1;
  std::vector<PlanContribution> contributions;
  std::vector<std::string> unestimated;  // plugins with no estimate hook
  std::vector<StageFlow> stages;         // per declared stage (skipped ones: all off)
  // Routed expert weights a tier keeps, and what a pass reads of them.
  RoutedReads routed;
  // Where recomputed stages' inputs wait for backward (a strategy's tier).
  tf_residency recompute_inputs_tier = TF_TIER_DEVICE;
  int64_t n_params = 0, n_trainable = 0;
  int64_t batch_size = 0, seq_len = 0;  // the training pass's (a schedule's own shape)
  // The schedule's own pass shape, when it has one (pass_rows = 0: the batch's).
  int64_t pass_rows = 0, pass_seq_len = 0;
  // What the schedule's sampling holds (rows = 0: it samples nothing).
  GenerationPlan generation;
  // The host process beyond the tracked bytes: its RSS while the plan was
  // made (libraries and runtime, plugins composed, nothing materialized).
  // 0 where the system does not say.
  int64_t host_overhead = 0;
  // [run] cpu_block_cache: freed blocks the allocator may keep resident for
  // reuse on top of that (given back before a process budget refuses).
  int64_t block_cache = 0;
  // [run] memory_budget_scope = "process": the budget bounds the tracked
  // bytes plus that overhead.
  bool process_scope = false;
  // What a budget must hold for this plan: the tracked peak, plus the
  // host overhead under a process-scope budget.
  int64_t budget_need() const { return tracked_peak + (process_scope ? host_overhead : 0); }
  // A budget no step should pass: the need plus the plan's margin of error
  // (kPlanMargin). The data (the corpus's tokens) comes on top, as for every
  // budget plan and fit speak of.
  int64_t safe_budget() const {
    return static_cast<int64_t>(static_cast<double>(budget_need()) * (1.0 + kPlanMargin));
  }
  // The largest miss of `bench/run plan` (35 recipes, 2026-11-23: -11.1%,
  // RWKV with bf16 weights), rounded up.
  static constexpr double kPlanMargin = 0.15;
};

// The plan of a session's parts (Session::parts()), composed with
// SessionOptions::dry_run or live.
MemoryPlan plan_memory(const KernelParts& kernel);

// "weights 1.0MiB, grads 1.0MiB, ...": what the device holds at the planned
// peak, by category (those with bytes), as plan and run messages print it.
std::string describe_device_peak(const MemoryPlan& plan);

}  // namespace tightfit
