#include "plugin_set.hpp"

#include <cstdio>
#include <utility>

#include "memory_accounting.hpp"

namespace tightfit {

void PluginSet::destroy_all() noexcept {
  auto destroy = [](PluginInstance& inst, auto destroy_fn) {
    void* state = std::exchange(inst.state, nullptr);
    if (!inst.plugin || !state || !destroy_fn) return;
    try {
      plugin_call(inst, "destroy", [&] { destroy_fn(state); });
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tightfit: [warning] %s\n", e.what());
    }
  };
  for (auto& r : rewards) destroy(r.instance, r.instance.plugin->reward()->destroy);
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

void rethrow_from_plugin(const PluginInstance& inst, const char* hook) {
  const std::string who = (inst.ctx ? inst.ctx->role : std::string("a")) + " plugin \"" +
                          (inst.plugin ? inst.plugin->name : std::string("?")) + "\"";
  try {
    throw;
  } catch (const std::exception& e) {
    if (auto refusal = budget_refusal(e)) throw OutOfBudgetError(*refusal);
    throw PluginCallError(who + " threw an exception in " + hook + " (" + e.what() +
                          "); a plugin must catch its exceptions and return a status");
  } catch (...) {
    throw PluginCallError(who + " threw an exception in " + hook +
                          "; a plugin must catch its exceptions and return a status");
  }
}

}  // namespace tightfit
