#include "memory_plan.hpp"

#include <algorithm>

#include "session.hpp"

namespace tightfit {

namespace {

int64_t element_bytes(at::ScalarType t) {
  return static_cast<int64_t>(c10::elementSize(t));
}

// The state slots per trainable value the recipe's optimizer keeps (fp32).
int64_t optimizer_slots(const ConfigTable& opt) {
  const std::string name = opt.get_string("name");
  if (name == "adamw") return 2;
  return opt.get_double("momentum") != 0 ? 1 : 0;
}

// The kernel's baseline: what the declarations show.
struct Baseline {
  CategoryCounts bytes{};
  int64_t head_grads = 0;     // gradients of the head stage's parameters (born first in backward)
  int64_t logits = 0;         // fp32 logits of one batch
  int64_t largest_param = 0;  // the update's workspace is per parameter
  int64_t n_params = 0, n_trainable = 0;
};

Baseline baseline(Session& s) {
  Baseline b;
  const tf_run_info& run = s.run_info();
  const int64_t tokens = run.batch_size * run.seq_len;
  const int64_t slots = optimizer_slots(s.optimizer_config());
  const auto& stages = s.stages();
  for (const Param& p : s.store().all()) {
    if (p.absent) continue;
    const int64_t n = p.numel();
    const int64_t bytes = n * element_bytes(p.dtype);
    b.n_params += n;
    b.bytes[(p.flags & TF_PARAM_ADAPTER) ? TF_MEM_ADAPTERS : TF_MEM_WEIGHTS] += bytes;
    if (!p.trainable) continue;
    b.n_trainable += n;
    b.bytes[TF_MEM_GRADS] += bytes;
    b.bytes[TF_MEM_OPTIMIZER] += 4 * slots * n;
    b.largest_param = std::max(b.largest_param, n);
    if (p.stage >= 0 && static_cast<size_t>(p.stage) < stages.size() &&
        stages[static_cast<size_t>(p.stage)].kind == TF_STAGE_HEAD)
      b.head_grads += bytes;
  }
  for (const StageState& st : stages)
    if (!st.skip) b.bytes[TF_MEM_ACTIVATIONS] += st.activation_bytes_per_token * tokens;
  b.logits = 4 * tokens * run.vocab_size;
  return b;
}

tf_model_summary summary(Session& s, const Baseline& b) {
  tf_model_summary m{};
  m.struct_size = sizeof m;
  m.n_params = b.n_params;
  m.n_trainable = b.n_trainable;
  m.param_bytes = b.bytes[TF_MEM_WEIGHTS];
  m.n_stages = static_cast<int32_t>(s.stages().size());
  m.batch_size = s.run_info().batch_size;
  m.seq_len = s.run_info().seq_len;
  m.activation_bytes = b.bytes[TF_MEM_ACTIVATIONS];
  return m;
}

PlanContribution ask(Session& s, PluginInstance& inst, const std::string& label,
                     tf_status (*hook)(void*, tf_host_context*, const tf_model_summary*,
                                       tf_memory_estimate*),
                     const tf_model_summary& model) {
  PlanContribution c;
  c.plugin = label;
  if (!hook) {
    c.estimated = false;
    return c;
  }
  tf_memory_estimate e{};
  e.struct_size = sizeof e;
  s.check(hook(inst.state, inst.ctx.get(), &model, &e), inst, "estimate_memory");
  for (int t = 0; t < TF_TIER_COUNT; ++t)
    for (int k = 0; k < TF_MEM_CATEGORY_COUNT; ++k) c.delta[t][k] = e.delta_bytes[t][k];
  c.time_factor = e.time_factor;
  return c;
}

}  // namespace

MemoryPlan plan_memory(Session& s) {
  const Baseline b = baseline(s);
  const tf_model_summary model = summary(s, b);
  MemoryPlan plan;
  plan.n_params = b.n_params;
  plan.n_trainable = b.n_trainable;
  plan.batch_size = s.run_info().batch_size;
  plan.seq_len = s.run_info().seq_len;

  TierCounts held{};
  held[TF_TIER_DEVICE] = b.bytes;
  for (PluginInstance& inst : s.strategies())
    plan.contributions.push_back(
        ask(s, inst, inst.plugin->name, inst.plugin->strategy()->estimate_memory, model));
  if (s.schedule().plugin)
    plan.contributions.push_back(ask(s, s.schedule(), "schedule " + s.schedule().plugin->name,
                                     s.schedule().plugin->schedule()->estimate_memory, model));
  for (const PlanContribution& c : plan.contributions) {
    if (!c.estimated) {
      plan.unestimated.push_back(c.plugin);
      continue;
    }
    for (int t = 0; t < TF_TIER_COUNT; ++t)
      for (int k = 0; k < TF_MEM_CATEGORY_COUNT; ++k) held[t][k] += c.delta[t][k];
    if (c.time_factor > 0) plan.time_factor *= c.time_factor;
  }
  for (auto& tier : held)
    for (auto& v : tier) v = std::max<int64_t>(v, 0);

  // The step's three moments on the device.
  const CategoryCounts& d = held[TF_TIER_DEVICE];
  const int64_t resident = d[TF_MEM_WEIGHTS] + d[TF_MEM_ADAPTERS] + d[TF_MEM_OPTIMIZER];
  const bool backward = d[TF_MEM_GRADS] > 0;
  const int64_t forward_end = resident + d[TF_MEM_ACTIVATIONS] + b.logits;
  const int64_t backward_start =
      backward ? resident + d[TF_MEM_ACTIVATIONS] + 2 * b.logits + b.head_grads : 0;
  const int64_t update =
      backward ? resident + d[TF_MEM_GRADS] + d[TF_MEM_TRANSIENT] + 4 * b.largest_param : 0;
  plan.device_peak = std::max({forward_end, backward_start, update});
  plan.peak_moment = plan.device_peak == update           ? "update"
                     : plan.device_peak == backward_start ? "backward"
                                                          : "forward";
  plan.at_peak = held;
  CategoryCounts& at = plan.at_peak[TF_TIER_DEVICE];
  if (plan.device_peak == update) {
    at[TF_MEM_ACTIVATIONS] = 0;
    at[TF_MEM_TRANSIENT] += 4 * b.largest_param;
  } else {
    at[TF_MEM_GRADS] = plan.device_peak == backward_start ? b.head_grads : 0;
    at[TF_MEM_TRANSIENT] = (plan.device_peak == backward_start ? 2 : 1) * b.logits;
  }
  plan.device_peak_by_category = d;
  plan.device_peak_by_category[TF_MEM_TRANSIENT] =
      std::max(d[TF_MEM_TRANSIENT] + 4 * b.largest_param, 2 * b.logits);
  for (int k = 0; k < TF_MEM_CATEGORY_COUNT; ++k) {
    plan.host_bytes += held[TF_TIER_HOST][k];
    plan.disk_bytes += held[TF_TIER_DISK][k];
  }
  return plan;
}

}  // namespace tightfit
