#include "step_cost.hpp"

#include <algorithm>
#include <set>
#include <vector>

#include "kernel_parts.hpp"

namespace tightfit {

namespace {

// The forward's share of a stage's elementwise work (backward about twice).
constexpr double kForwardShare = 1.0 / 3;
// AdamW touches per trainable value: the weight read and written, the
// gradient read, two fp32 moments read and written.
constexpr double kUpdateBytesPerValue = 4 * 2 + 4 + 8 * 2;

struct StageWork {
  double flops = 0;           // forward matmul FLOPs of one micro-batch
  double adapter_values = 0;  // LoRA parameters in the stage
  bool bf16 = false;
  double compact_values = 0;              // quantized weights dequantized at each use
  double fp32_dense_values = 0;           // weights autocast casts at each use
  double host_bytes = 0, disk_bytes = 0;  // offloaded weights fetched at each use
};

}  // namespace

CostOptions cost_options(const MemoryPlan& plan) {
  CostOptions o;
  for (const PlanContribution& c : plan.contributions) {
    if (!c.estimated) continue;
    o.low_precision_compute = o.low_precision_compute || c.autocast_compute;
    o.prefetch = std::max(o.prefetch, static_cast<int>(c.prefetch_stages));
    o.micro_batches = std::max<int64_t>(o.micro_batches, c.micro_batches);
    if (c.rank_exchange > 0) o.zero_stage = std::max(o.zero_stage, c.rank_exchange - 1);
  }
  return o;
}

StepCost predict_step_cost(const KernelParts& s, const MemoryPlan& plan, const MachineRates& rates,
                           const CostOptions& options) {
  StepCost cost;
  const tf_run_info& run = s.env->run_info;
  const double tokens = static_cast<double>(run.batch_size * run.seq_len);
  const int64_t tile = s.env->config.run.mlp_tile_tokens;
  const auto& stages = s.executor->stages();
  const size_t n = stages.size();
  std::vector<StageWork> work(n);
  auto stage_of = [&](const Param& p) {
    return p.stage >= 0 && static_cast<size_t>(p.stage) < n ? static_cast<size_t>(p.stage) : n - 1;
  };
  double trainable_values = 0;
  double trained_on_tier = 0, trained_on_disk = 0;  // bytes written back after the update
  const auto& table = s.plan->params;
  for (const Param& p : s.store->all()) {
    const auto it = table.find(p.name);
    if (it == table.end()) continue;  // absent or skipped: never touched
    StageWork& w = work[stage_of(p)];
    const double values = static_cast<double>(p.numel());
    const tf_param_plan& planned = it->second;
    const bool adapter = (p.flags & TF_PARAM_ADAPTER) != 0;
    if (p.trainable) {
      trainable_values += values;
      if (adapter) w.adapter_values += values;
    }
    if (planned.format != TF_FORMAT_DENSE) {
      w.compact_values += values;
    } else {
      const double bytes_per_value = static_cast<double>(planned.bytes) / std::max(1.0, values);
      if (bytes_per_value <= 2 && p.shape.size() >= 2) w.bf16 = true;  // bf16 weights
      if (bytes_per_value == 4 && p.shape.size() >= 2 && !adapter) w.fp32_dense_values += values;
    }
    // Frozen experts in a tier come in when routed to (plan.routed), not with the stage.
    const bool routed = read_when_routed(p);
    if (planned.tier == TF_TIER_HOST && !routed) w.host_bytes += static_cast<double>(planned.bytes);
    if (planned.tier == TF_TIER_DISK && !routed) w.disk_bytes += static_cast<double>(planned.bytes);
    if (p.trainable && planned.tier == TF_TIER_HOST)
      trained_on_tier += static_cast<double>(planned.bytes);
    if (p.trainable && planned.tier == TF_TIER_DISK)
      trained_on_disk += static_cast<double>(planned.bytes);
  }
  // A tier larger than what the page cache can hold is read cold every step.
  const bool disk_cold = plan.disk_bytes > 0 &&
                         static_cast<double>(plan.disk_bytes) >
                             0.8 * static_cast<double>(std::max<int64_t>(rates.ram_available, 1));
  const double disk_read = disk_cold ? rates.disk_read_cold : rates.disk_read_warm;
  // The tier is memory-mapped: while it fits the page cache, writes are
  // copies into it (the kernel flushes them in the background).
  const double disk_write = disk_cold ? rates.disk_write : rates.disk_read_warm;
  // On a CPU run the host tier is the same RAM: nothing crosses a link.
  const double host_read = s.env->device.is_cpu() ? 0 : rates.host_link_bytes_per_s;

  double per_micro_matmul = 0, per_micro_recompute = 0, per_micro_memory = 0, per_micro_dequant = 0,
         per_micro_transfer = 0;
  for (size_t i = 0; i < n; ++i) {
    const StageState& st = stages[i];
    if (st.skip) continue;
    StageWork& w = work[i];
    // Whether a gradient flows, recomputation, what trains and what is kept:
    // as the plan's timeline has it.
    const StageFlow& f = plan.stages[i];
    w.bf16 = w.bf16 || options.low_precision_compute;
    const double flops = static_cast<double>(st.flops_per_token) * tokens;
    const double activation_bytes = static_cast<double>(f.kept_bytes);

    // On a CPU, 16-bit matmuls measured alone run several times faster than
    // fp32 (AMX), but whole 16-bit training steps measured here do not
    // (`fit --verify`: bf16 and autocast steps as slow as fp32 or slower),
    // so a CPU step is costed at fp32 rates per value whatever its dtype.
    const bool fast16 = w.bf16 && !s.env->device.is_cpu();
    const int64_t rows = run.batch_size * run.seq_len;
    const double rate = std::max(1.0, w.bf16 && !fast16 ? std::min(rates.matmul_flops(rows, false),
                                                                   rates.matmul_flops(rows, true))
                                                        : rates.matmul_flops(rows, w.bf16));
    // Forward once; backward: the input's gradient (where a gradient flows)
    // and the weights' (where they train); adapters 2 FLOPs a value a token
    // per product, three products (forward, two gradients).
    const double adapter_flops = 2 * w.adapter_values * tokens;
    const double forward = (flops + adapter_flops) / rate;
    const double backward =
        f.backward ? ((f.weights_train ? 2 : 1) * flops + 2 * adapter_flops) / rate : 0;
    per_micro_matmul += forward + backward;
    if (f.recomputed) per_micro_recompute += forward;
    // [run] mlp_tile_tokens: a pass wider than the tile computes each tile
    // again in backward (tiled_feed_forward_contribution's time).
    if (f.backward && tile > 0 && rows > tile)
      per_micro_recompute += static_cast<double>(st.tiled_flops_per_token) * tokens / rate;

    const double uses = 1 + (f.recomputed ? 1 : 0) + (f.backward ? 1 : 0);
    // The elementwise work scales with what autograd keeps: forward and
    // backward at the measured rate; a recompute runs the forward's share
    // again; without a backward only the forward's.
    // The declared bytes are in the model's dtype; where 16-bit compute is
    // fast (GPUs) the values move at the 16-bit rate, on a CPU at fp32's.
    const double act_rate = std::max(
        1.0, fast16 ? 2 * rates.activation_bf16_bytes_per_s : rates.activation_fp32_bytes_per_s);
    const double act_passes = f.backward ? 1 + (f.recomputed ? kForwardShare : 0) : kForwardShare;
    per_micro_memory += act_passes * activation_bytes / act_rate;
    if (options.low_precision_compute)  // fp32 read, bf16 written, per forward (cast cached)
      per_micro_memory +=
          (1 + (f.recomputed ? 1 : 0)) * 6 * w.fp32_dense_values / rates.memory_bytes_per_s;
    per_micro_dequant += uses * w.compact_values / std::max(1.0, rates.dequant_values_per_s);

    // Offloaded weights are fetched for the forward (and recompute) and the
    // backward; prefetch overlaps a fetch with the compute of the stages
    // before it, up to `prefetch` stages of it.
    double fetch = 0;
    if (w.disk_bytes > 0) fetch += w.disk_bytes / std::max(1.0, disk_read);
    if (w.host_bytes > 0 && host_read > 0) fetch += w.host_bytes / host_read;
    const double fetches = 1 + (f.backward ? 1 : 0);
    const double hidden = std::min(2, options.prefetch) * (forward + backward) / fetches;
    per_micro_transfer += fetches * std::max(0.0, fetch - hidden);
    // Routed experts are read once the router has chosen them, at each
    // use: priced whole (a read-ahead of the chosen ones, offload's
    // expert_prefetch, overlaps them with the expert before; not credited).
    if (i < plan.routed.stage_disk_bytes.size()) {
      double routed = plan.routed.stage_disk_bytes[i] / std::max(1.0, disk_read);
      if (host_read > 0) routed += plan.routed.stage_host_bytes[i] / host_read;
      per_micro_transfer += uses * routed;
    }

    // A recomputed stage's input kept on a tier: written behind the forward,
    // read back ahead of its recompute (while the stage above runs backward).
    if (f.recomputed && plan.recompute_inputs_tier != TF_TIER_DEVICE) {
      const bool disk = plan.recompute_inputs_tier == TF_TIER_DISK;
      const double bytes = static_cast<double>(f.input_bytes);
      if (disk || host_read > 0) {
        const double write = bytes / std::max(1.0, disk ? disk_write : host_read);
        const double read = bytes / std::max(1.0, disk ? disk_read : host_read);
        per_micro_transfer +=
            std::max(0.0, write - forward) + std::max(0.0, read - (forward + backward));
      }
    }
  }
  const double m = static_cast<double>(std::max<int64_t>(1, options.micro_batches));
  cost.matmul = m * per_micro_matmul;
  cost.recompute = m * per_micro_recompute;
  cost.memory = m * per_micro_memory;
  cost.dequant = m * per_micro_dequant;
  cost.transfer = m * per_micro_transfer;

  // The update: AdamW's traffic over the trainable values, gradients summed
  // across micro-batches, compact (8-bit) state decoded and encoded, and the
  // state's tier traffic.
  const double bw = rates.memory_bytes_per_s;
  cost.update = trainable_values * kUpdateBytesPerValue / bw + (m - 1) * trainable_values * 12 / bw;
  double state_device = 0, state_host = 0, state_disk = 0;
  for (int t = 0; t < TF_TIER_COUNT; ++t) {
    const double b = static_cast<double>(plan.at_peak[static_cast<size_t>(t)][TF_MEM_OPTIMIZER]);
    (t == TF_TIER_HOST ? state_host : t == TF_TIER_DISK ? state_disk : state_device) += b;
  }
  const double state_total = state_device + state_host + state_disk;
  if (trainable_values > 0 && state_total < 6 * trainable_values)  // compact moments
    cost.update += 4 * trainable_values / std::max(1.0, rates.dequant_values_per_s);
  if (state_host > 0 && host_read > 0)  // gradients down, weights back up
    cost.update += 2 * 4 * trainable_values / host_read;
  // Trained weights kept on a tier are written back there after each update.
  if (trained_on_tier > 0 && host_read > 0) cost.update += trained_on_tier / host_read;
  if (trained_on_disk > 0) cost.update += trained_on_disk / std::max(1.0, disk_write);
  if (state_disk > 0)
    cost.update += state_disk / std::max(1.0, disk_read) + state_disk / std::max(1.0, disk_write);

  // Ranks: a ring all-reduce (or reduce-scatter + all-gather, ZeRO 1-2)
  // moves 2 (r-1)/r of the gradients through each rank; ZeRO-3 gathers the
  // weights again for forward and backward. ZeRO's partitioned update
  // touches 1/r of the state.
  const double world = static_cast<double>(std::max(1, run.world_size));
  if (options.zero_stage >= 0 && world > 1) {
    const double link = std::max(1.0, rates.host_link_bytes_per_s);
    const double share = (world - 1) / world;
    double grad_bytes = 0, weight_bytes = 0;
    for (const Param& p : s.store->all()) {
      const auto it = table.find(p.name);
      if (it == table.end()) continue;
      if (p.trainable) grad_bytes += static_cast<double>(p.numel()) * 4;
      weight_bytes += static_cast<double>(it->second.bytes);
    }
    cost.collective = 2 * share * grad_bytes / link;
    if (options.zero_stage == 3) cost.collective += 2 * share * weight_bytes / link;
    if (options.zero_stage >= 1) cost.update /= world;
  }
  // A plugin whose time shows in the plan is priced above; any other's own
  // time_factor (a third-party strategy, hybrid, MeZO) multiplies.
  for (const PlanContribution& c : plan.contributions) {
    if (c.time_factor > 0 && !c.time_from_plan) cost.other *= c.time_factor;
  }
  return cost;
}

}  // namespace tightfit
