// The step-time cost model `tightfit fit` ranks strategy stacks with: from a
// session's planned parts (plan_memory has filled their parameter table) and the
// machine's measured rates, the seconds one optimizer step should take, in
// parts: matmuls (forward, backward, recomputation) at the measured FLOP/s
// of their dtype and micro-batch, memory-bound work on the activations,
// dequantizing compact weights each time they are used, moving offloaded
// weights and optimizer state between tiers (what prefetch cannot hide, and
// routed experts, read once the router has chosen them), and
// the update, and what ranks exchange (at the host link's rate: on one
// machine the ranks' traffic crosses memory or PCIe; across machines it is
// slower than this says).
#pragma once

#include <string>

#include "machine_rates.hpp"
#include "memory_plan.hpp"

namespace tightfit {

struct KernelParts;

// What the cost model needs to know that the plan does not show.
struct CostOptions {
  bool low_precision_compute = false;  // bf16/fp16 autocast
  int prefetch = 0;                    // stages an offloaded tier is read ahead
  int64_t micro_batches = 1;           // passes of data.batch_size per update
  int zero_stage = -1;                 // ranks: -1 none (one rank), 0 data parallel, 1-3 ZeRO stage
};

struct StepCost {
  double matmul = 0;      // forward and backward matmuls
  double recompute = 0;   // checkpointed stages' forward again
  double memory = 0;      // memory-bound work on the activations (and autocast's casts)
  double dequant = 0;     // compact weights made dense at each use
  double transfer = 0;    // tier traffic prefetch does not hide
  double update = 0;      // the optimizer step, with its state's tier traffic
  double collective = 0;  // gradients (and ZeRO-3's weights) between ranks
  double other = 1;       // factor from plugins' own time estimates (third-party strategies)
  double total() const {
    return (matmul + recompute + memory + dequant + transfer + update + collective) * other;
  }
};

// What the plugins' estimates say of the step (tf_memory_estimate's
// autocast_compute, prefetch_stages, micro_batches, rank_exchange): the
// options a planned recipe is priced with.
CostOptions cost_options(const MemoryPlan& plan);

// Seconds per optimizer step. `plan` must be plan_memory(kernel).
StepCost predict_step_cost(const KernelParts& kernel, const MemoryPlan& plan,
                           const MachineRates& rates, const CostOptions& options);

}  // namespace tightfit
