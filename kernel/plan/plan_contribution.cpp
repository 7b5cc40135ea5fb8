// One plugin's answer to `plan`: its estimate_memory hook asked, the
// answer read into the kernel's PlanContribution (fields a plugin's ABI
// version predates read as zero: the struct is zero-filled and sized).
#include "plan_contribution.hpp"

#include <algorithm>

#include "executor.hpp"
#include "kernel_parts.hpp"
#include "run_environment.hpp"
#include "strategy_chain.hpp"

namespace tightfit {

PlanContribution ask_plan_contribution(const KernelParts&, PluginInstance& inst,
                                       const std::string& label, EstimateHook hook,
                                       const tf_model_summary& model) {
  PlanContribution c;
  c.plugin = label;
  if (!hook) {
    c.estimated = false;
    return c;
  }
  tf_memory_estimate e{};
  e.struct_size = sizeof e;
  check_plugin_status(guarded_call(inst, "estimate_memory", hook, &model, &e), inst,
                      "estimate_memory");
  for (int t = 0; t < TF_TIER_COUNT; ++t)
    for (int k = 0; k < TF_MEM_CATEGORY_COUNT; ++k) c.delta[t][k] = e.delta_bytes[t][k];
  c.time_factor = e.time_factor;
  c.time_from_plan = e.time_from_plan != 0;
  c.grads_in_forward = e.grads_in_forward != 0;
  c.update_bytes = std::max<int64_t>(0, e.update_bytes);
  c.forward_bytes = std::max<int64_t>(0, e.forward_bytes);
  c.block_bytes = e.block_bytes;  // may be negative: summed, then kept >= 0
  c.autocast_compute = e.autocast_compute != 0;
  c.prefetch_stages = std::max(0, e.prefetch_stages);
  c.micro_batches = std::max(0, e.micro_batches);
  c.rank_exchange = std::clamp(e.rank_exchange, 0, 4);
  c.pass_rows = std::max<int64_t>(0, e.pass_rows);
  c.pass_seq_len = std::max<int64_t>(0, e.pass_seq_len);
  c.generate_rows = std::max<int64_t>(0, e.generate_rows);
  c.generate_new_tokens = std::max<int64_t>(0, e.generate_new_tokens);
  c.generate_prompts = std::max<int64_t>(0, e.generate_prompts);
  if (e.recompute_inputs_tier == TF_TIER_HOST || e.recompute_inputs_tier == TF_TIER_DISK)
    c.recompute_inputs_tier = static_cast<tf_residency>(e.recompute_inputs_tier);
  return c;
}

PlanContribution tiled_feed_forward_contribution(const KernelParts& s,
                                                 const std::vector<bool>& backward) {
  PlanContribution c;
  c.plugin = "feed-forward in tiles (run.mlp_tile_tokens)";
  c.time_from_plan = true;
  const int64_t tile = s.env->config.run.mlp_tile_tokens;
  const tf_run_info& run = s.env->run_info;
  if (tile <= 0 || run.batch_size * run.seq_len <= tile) return c;  // one tile: run whole
  double tiled = 0, total = 0;
  const auto& stages = s.executor->stages();
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].skip) continue;
    total += static_cast<double>(stages[i].flops_per_token);
    if (i < backward.size() && backward[i])
      tiled += static_cast<double>(stages[i].tiled_flops_per_token);
  }
  if (total > 0 && tiled > 0) c.time_factor = 1.0 + tiled / (3.0 * total);
  return c;
}

}  // namespace tightfit
