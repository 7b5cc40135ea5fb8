// The recipe's [[reward]] tables (ABI 1.25): each a reward plugin with its
// weight (TRL's reward_weights) and the name its metrics carry (TRL's reward
// function's name), made after the schedule. Only a schedule that samples
// its own completions (TF_SCHEDULE_FEATURE_PROMPTS) reads them, and it
// needs at least one.
#include <cmath>

#include "recipe_error.hpp"
#include "session.hpp"

namespace tightfit {

void Session::create_rewards() {
  const std::vector<const toml::table*> tables = recipe_.array_tables("reward");
  const bool samples = (schedule_features() & TF_SCHEDULE_FEATURE_PROMPTS) != 0;
  if (!samples && !tables.empty())
    throw RecipeError(recipe_.where(*tables.front()) +
                      ": [[reward]] scores completions that the "
                      "schedule samples itself, and schedule \"" +
                      schedule_name() +
                      "\" samples none: set [schedule] plugin = \"grpo\", or leave the "
                      "[[reward]] tables out");
  if (samples && tables.empty())
    throw RecipeError(recipe_.source() + ": schedule \"" + schedule_name() +
                      "\" trains on rewards of the completions it samples, and the recipe has no "
                      "[[reward]] table: add one, e.g. [[reward]] plugin = \"length\" (`tightfit "
                      "plugins` lists the reward plugins)");
  for (const toml::table* t : tables) {
    const std::string name = recipe_.required_string(t, "reward", "plugin");
    RewardInstance r;
    r.instance =
        make_instance(name, TF_PLUGIN_REWARD, t, "reward", recipe_.where(*t->get("plugin")));
    r.instance.ctx->role = "reward #" + std::to_string(plugins_.rewards.size() + 1);
    r.name = name;
    if (const toml::node* n = t->get("name")) {
      const auto* s = n->as_string();
      if (!s || s->get().empty())
        throw RecipeError(recipe_.where(*n) +
                          ": name must be a non-empty string (the name the "
                          "reward's metrics carry)");
      r.name = s->get();
    }
    for (const RewardInstance& other : plugins_.rewards)
      if (other.name == r.name)
        throw RecipeError(recipe_.where(*t->get("plugin")) + ": a second reward named \"" + r.name +
                          "\": their metrics would mix; give one a name = \"...\"");
    if (const toml::node* w = t->get("weight")) {
      const std::optional<double> v = w->value<double>();
      if (!v || !std::isfinite(*v))
        throw RecipeError(recipe_.where(*w) +
                          ": weight must be a finite number (TRL's "
                          "reward_weights; 1 when left out)");
      r.weight = *v;
    }
    if (const toml::node* w = t->get("time_limit")) {
      const std::optional<double> v = w->value<double>();
      if (!v || !(*v > 0) || !std::isfinite(*v))
        throw RecipeError(recipe_.where(*w) +
                          ": time_limit must be a number of seconds > 0 (how long one call of "
                          "the reward's score may take before the run stops; " +
                          std::to_string(static_cast<int>(kRewardTimeLimitSeconds)) +
                          " when left out)");
      r.time_limit_s = *v;
    }
    plugins_.rewards.push_back(std::move(r));
    PluginInstance& inst = plugins_.rewards.back().instance;
    const tf_status st = plugin_call(inst, "create", [&] {
      return inst.plugin->reward()->create(host_api(), inst.ctx.get(), &inst.state);
    });
    if (st == TF_ERR_INVALID_ARGUMENT)
      throw RecipeError(recipe_.where(*t->get("plugin")) + ": " + inst.ctx->plugin_error);
    check_plugin_status(st, inst, "create");
  }
  for (const RewardInstance& r : plugins_.rewards) plugins_.reward_names.push_back(r.name.c_str());
}

}  // namespace tightfit
