// A stack `tightfit fit` planned — its recipe, memory plan and predicted
// step cost — and how fit shows one.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "fit_search.hpp"
#include "machine_rates.hpp"
#include "memory_plan.hpp"
#include "plugin_loader.hpp"
#include "recipe.hpp"
#include "step_cost.hpp"

namespace tightfit::host {

struct Planned {
  FitChoice choice;
  Recipe recipe;
  MemoryPlan plan;
  StepCost cost;
};

// Plans `recipe` as a dry run for `ranks` ranks.
Planned plan_recipe(const Recipe& recipe, const PluginRegistry& registry, int ranks,
                    const MachineRates& rates, const FitChoice& choice);

// Seconds as fit prints them: 3 decimals under 10, else 1.
std::string seconds(double s);
// What the stack changes in the maths, or "exact".
std::string quality_text(const FitChoice& c);
// One stack in fit's JSON: its plan, predicted time, slowdown and costs.
nlohmann::json choice_json(const Planned& p, double plain_s);

}  // namespace tightfit::host
