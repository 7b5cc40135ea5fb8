// Asking a plugin (strategy, schedule, reward) what it does to the plan.
#pragma once

#include <string>

#include "memory_plan.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

struct KernelParts;
struct PluginInstance;

using EstimateHook = tf_status (*)(void*, tf_host_context*, const tf_model_summary*,
                                   tf_memory_estimate*);

// `hook` of `inst` asked about `model`; a plugin without the hook is
// reported as not estimated (its effect is not in the plan).
PlanContribution ask_plan_contribution(const KernelParts& s, PluginInstance& inst,
                                       const std::string& label, EstimateHook hook,
                                       const tf_model_summary& model);

}  // namespace tightfit
