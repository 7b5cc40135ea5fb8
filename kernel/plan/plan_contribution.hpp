// Asking a plugin (strategy, schedule, reward) what it does to the plan.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memory_accounting.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

struct KernelParts;
struct PluginInstance;

using TierCounts = std::array<CategoryCounts, TF_TIER_COUNT>;

struct PlanContribution {
  std::string plugin;  // "checkpoint", "schedule hybrid", ...
  bool estimated = true;
  TierCounts delta{};
  double time_factor = 0;       // 0 = the plugin does not say
  bool time_from_plan = false;  // its time shows in the plan (the cost model prices it)
  bool grads_in_forward = false;
  int64_t update_bytes = 0;   // alive only during the update
  int64_t forward_bytes = 0;  // alive only at the end of forward
  int64_t block_bytes = 0;    // alive only while a decoder block computes
  tf_residency recompute_inputs_tier = TF_TIER_DEVICE;
  // What the step cost model reads of it (ABI 1.24; 0: nothing of the kind).
  bool autocast_compute = false;
  int32_t prefetch_stages = 0;
  int32_t micro_batches = 0;
  int32_t rank_exchange = 0;  // 1 gradients, 2-4 ZeRO stage 1-3
  // A schedule's own training pass shape, and what it samples (ABI 1.26).
  int64_t pass_rows = 0, pass_seq_len = 0;
  int64_t generate_rows = 0, generate_new_tokens = 0;
  int64_t generate_prompts = 0;  // 1.27: the prompts those rows complete
};

using EstimateHook = tf_status (*)(void*, tf_host_context*, const tf_model_summary*,
                                   tf_memory_estimate*);

// `hook` of `inst` asked about `model`; a plugin without the hook is
// reported as not estimated (its effect is not in the plan).
PlanContribution ask_plan_contribution(const KernelParts& s, PluginInstance& inst,
                                       const std::string& label, EstimateHook hook,
                                       const tf_model_summary& model);

// [run] mlp_tile_tokens: a training pass wider than the tile computes the
// stages' tiled part (tf_stage_spec.tiled_flops_per_token) once more in
// backward. Its time as a factor on the step (a forward a third of forward
// and backward, as the checkpoint's recompute); none (time_factor 0) where
// nothing tiles. `backward`: whether a gradient flows through each stage
// (only those compute their tiles again). Priced by the cost model itself
// (time_from_plan).
PlanContribution tiled_feed_forward_contribution(const KernelParts& s,
                                                 const std::vector<bool>& backward);

}  // namespace tightfit
