#include "fit_planned.hpp"

#include <cstdio>

#include "session.hpp"

using nlohmann::json;

namespace tightfit::host {

Planned plan_recipe(const Recipe& recipe, const PluginRegistry& registry, int ranks,
                    const MachineRates& rates, const FitChoice& choice) {
  SessionOptions so;
  so.dry_run = true;
  so.plan_world_size = ranks;
  Session session(recipe, registry, so);
  Planned p{choice, recipe, plan_memory(session.parts()), {}};
  p.cost = predict_step_cost(session.parts(), p.plan, rates, cost_options(p.plan));
  return p;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.3f" : "%.1f", s);
  return buf;
}

std::string quality_text(const FitChoice& c) {
  const auto a = c.approximations();
  if (a.empty()) return "exact";
  std::string out = a[0];
  for (size_t i = 1; i < a.size(); ++i) out += ", " + a[i];
  return out;
}

json choice_json(const Planned& p, double plain_s) {
  return {{"stack", p.choice.describe()},
          {"planned_peak", p.plan.tracked_peak},
          {"predicted_step_s", p.cost.total()},
          {"slowdown", plain_s > 0 ? p.cost.total() / plain_s : 0},
          {"quality", quality_text(p.choice)},
          {"quality_penalty", p.choice.quality_penalty()},
          {"cost",
           {{"matmul", p.cost.matmul},
            {"recompute", p.cost.recompute},
            {"memory", p.cost.memory},
            {"dequant", p.cost.dequant},
            {"transfer", p.cost.transfer},
            {"update", p.cost.update}}}};
}

}  // namespace tightfit::host
