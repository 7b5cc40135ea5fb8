// The plugins a session composed — the model, the strategies in recipe order
// and the schedule — each an instance with its own host context, and the
// registry whose loaded libraries they point into.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "plugin_call_scope.hpp"
#include "plugin_loader.hpp"
#include "progress.hpp"
#include "recipe.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {
struct KernelParts;
class SafetensorsWriter;
class SafetensorsSet;
}  // namespace tightfit

// The per-plugin-instance context behind the ABI's opaque tf_host_context.
struct tf_host_context {
  // The session's parts the host services work on (host_api_*.cpp).
  tightfit::KernelParts* kernel = nullptr;
  // The thread that made the context (the session's); host services refuse
  // a plugin's own threads (host_api_services.hpp), and warn about it once.
  std::thread::id owner_thread = std::this_thread::get_id();
  std::atomic<bool> warned_foreign_thread{false};
  std::string plugin_name;
  std::string role;  // "model", "strategy #1", "schedule"
  tightfit::ConfigTable config;
  std::string last_error;    // the host's last failed service call
  std::string plugin_error;  // what the plugin reported with set_error
  // A budget refusal a host service reported to this plugin and not yet
  // checked: the run stops out of budget whatever status the plugin returns.
  std::string budget_refusal;
  // Checkpoint state I/O, set only inside save_state / load_state: each
  // tensor is written to (read from) its file as the plugin puts (gets) it.
  tightfit::SafetensorsWriter* state_out = nullptr;
  const tightfit::SafetensorsSet* state_in = nullptr;
  std::string state_prefix;
  // The last tensor file this plugin read with tensors_load.
  std::string loaded_path;
  std::map<std::string, at::Tensor> loaded_tensors;
  // The plugin's own long phase (the progress service), ended when the
  // plugin call it was reported in returns. The unit outlives it.
  std::string progress_phase, progress_unit;
  std::unique_ptr<tightfit::Progress> progress;
  void end_progress() noexcept {
    progress.reset();
    progress_phase.clear();
  }
};

namespace tightfit {

// A plugin reported an error.
struct PluginCallError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct PluginInstance {
  const LoadedPlugin* plugin = nullptr;
  void* state = nullptr;
  std::unique_ptr<tf_host_context> ctx;
};

// Returns for TF_OK and TF_NOT_HANDLED; any other status (unknown ones too)
// throws PluginCallError naming the plugin's role, its name and `what`, with
// the message it set (OutOfBudgetError for a budget refusal).
void check_plugin_status(tf_status status, const PluginInstance& inst, const char* what);

// Inside a catch: the exception a plugin let through the C ABI in `hook`,
// thrown again as a PluginCallError naming the plugin, its role and the hook
// (an OutOfBudgetError when it was the budget refusing an allocation).
[[noreturn]] void rethrow_from_plugin(const PluginInstance& inst, const char* hook);

// The one door into a plugin: create, destroy, every strategy hook,
// run_step, save_state and load_state all run `call` through it. Its host
// services are served on this thread while it runs, and no exception gets
// past it unnamed.
template <class Call>
auto plugin_call(const PluginInstance& inst, const char* hook, Call&& call) -> decltype(call()) {
  const PluginCallScope in_plugin_call;
  struct EndsItsProgress {
    tf_host_context* ctx;
    ~EndsItsProgress() {
      if (ctx) ctx->end_progress();
    }
  } ends_its_progress{inst.ctx.get()};
  try {
    return call();
  } catch (...) {
    rethrow_from_plugin(inst, hook);
  }
}

// A [[reward]] table's plugin (ABI 1.25), with its weight and the name its
// metrics carry.
// How long one call of a reward's score may take, unless its table's
// time_limit says otherwise: a stuck reward stops the run, never hangs it.
inline constexpr double kRewardTimeLimitSeconds = 300;

struct RewardInstance {
  PluginInstance instance;
  double weight = 1.0;
  std::string name;
  double time_limit_s = kRewardTimeLimitSeconds;
};

struct PluginSet {
  PluginSet() = default;
  // Destroys the instances (destroy_all) if the owner has not.
  ~PluginSet() { destroy_all(); }
  PluginSet(const PluginSet&) = delete;
  PluginSet& operator=(const PluginSet&) = delete;

  // Each instance's destroy, schedule first and model last (the reverse of
  // creation); the libraries stay loaded (the loader never unloads one).
  // Never throws (it runs in destructors): a destroy that throws is reported
  // on stderr naming the plugin, and the others are still destroyed.
  void destroy_all() noexcept;

  PluginRegistry registry;  // owns the plugin records the instances point to
  PluginInstance model;
  std::vector<PluginInstance> strategies;
  PluginInstance schedule;
  std::vector<RewardInstance> rewards;    // in recipe order
  std::vector<const char*> reward_names;  // into `rewards`, made once they are all made
  // True while the model and the strategies may declare parameters and
  // stages (from the model's create to the last strategy's configure).
  bool declaring = false;
  // True in the schedule's create, where it may declare copies of the
  // parameters (declare_param_copies): the strategies are configured, and
  // nothing is made yet.
  bool declaring_copies = false;
};

}  // namespace tightfit
