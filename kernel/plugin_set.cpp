#include "plugin_set.hpp"

#include <utility>

#include "memory_accounting.hpp"

namespace tightfit {

void PluginSet::destroy_all() {
  auto destroy = [](PluginInstance& inst, auto destroy_fn) {
    if (inst.plugin && inst.state && destroy_fn) destroy_fn(inst.state);
    inst.state = nullptr;
  };
  destroy(schedule, schedule.plugin ? schedule.plugin->schedule()->destroy : nullptr);
  for (auto& s : strategies) destroy(s, s.plugin->strategy()->destroy);
  destroy(model, model.plugin ? model.plugin->model()->destroy : nullptr);
}

void check_plugin_status(tf_status status, const PluginInstance& inst, const char* what) {
  if (status == TF_OK || status == TF_NOT_HANDLED) return;
  std::string msg = inst.ctx->plugin_error;
  if (msg.empty()) msg = inst.ctx->last_error;
  if (msg.empty()) msg = "status " + std::to_string(static_cast<int>(status));
  inst.ctx->plugin_error.clear();
  inst.ctx->last_error.clear();
  // A budget refusal a host service reported may come back from the plugin
  // as a generic error: the service recorded it.
  const std::string refusal = std::exchange(inst.ctx->budget_refusal, std::string());
  if (!refusal.empty()) throw OutOfBudgetError(refusal);
  if (status == TF_ERR_OUT_OF_MEMORY) throw OutOfBudgetError(msg);
  throw PluginCallError(inst.ctx->role + " plugin \"" + inst.plugin->name + "\" failed in " + what +
                        ": " + msg);
}

}  // namespace tightfit
