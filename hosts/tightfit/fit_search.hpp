// The stacks `tightfit fit` searches, from what the installed plugins declare
// (tf_plugin_search, tf_key_search): each plugin fit may add is a knob (in or
// out), each searched key another (its values from the least to the most
// memory-saving), and a choice is one value per knob. fit names no plugin:
// a third-party strategy that declares its search is searched the same way.
#pragma once

#include <string>
#include <vector>

#include "plugin_loader.hpp"
#include "recipe.hpp"

namespace tightfit::host {

// A plugin fit manages: its recipe table (or, for a schedule, [schedule]) is
// replaced by the choice's.
struct FitPlugin {
  std::string name;
  bool schedule = false;  // stands in for the recipe's schedule
  PluginSearch search;
  std::vector<KeySpec> keys;
  bool optional = true;  // false: in every stack (the recipe's adapters, shard with ranks)
  toml::table user;      // the recipe's table for it: keys fit does not search stay
};

// One thing a stack chooses: a plugin in or out (key empty: values out, in),
// or the value of one of its keys.
struct FitKnob {
  size_t plugin = 0;
  std::string key;
  std::vector<SearchValue> values;  // from the least to the most memory-saving
  int with = -1;                    // a knob of the same plugin: searched while it is not OFF
  uint32_t key_flags = 0;           // TF_SEARCH_KEY_*
};

struct FitChoice {
  std::vector<int> at;   // per knob, its value's index; -1: not chosen in this stack
  std::vector<char> in;  // per plugin of the space, whether the stack has it
  // What `finish_choice` works out from the above.
  std::string described = "plain";         // "lora r16 + nf4 base + checkpoint 1", or "plain"
  std::vector<std::string> changed_maths;  // what the stack changes in the maths
  double penalty = 0;                      // for --objective quality: 0 exact
  int added = 0;                           // plugins the stack adds
  int settings = 0;                        // the parts of its description
  std::vector<char> may_cost;  // per knob: its value may cost memory (TF_SEARCH_VALUE_MAY_COST)

  const std::string& describe() const { return described; }
  int strategies() const { return added; }
  const std::vector<std::string>& approximations() const { return changed_maths; }
  double quality_penalty() const { return penalty; }
  // Whether `other` saves at least as much on every knob (so if `other`
  // does not fit, this one does not either).
  bool saves_no_more_than(const FitChoice& other) const;
};

struct FitSpace {
  std::vector<FitPlugin> plugins;
  std::vector<FitKnob> knobs;
  std::vector<std::string> kept;  // plugins in the recipe fit leaves as they are
  bool cuda = false;
  int64_t batch_size = 1;          // the recipe's (the effective batch with micro-batches)
  bool adapters_possible = false;  // a plugin training adapters could be turned to
  bool trains_all_weights = true;  // no stack trains adapters
  std::vector<std::string> notes;  // why a plugin or key is fixed

  int plugin_index(const std::string& name) const;
};

// The search space for `base` given the installed plugins, the device, and
// the user's --keep / --without / --change lists. The recipe's choices stay:
// what trains (its adapters at their rank, and at `lora_ranks` only when the
// user gave them) and a TF_SEARCH_KEY_RECIPES_CHOICE key (others only with
// the plugin in `change`); `adapters_instead` turns a recipe that trains all
// weights to an adapter plugin (at `lora_ranks`, else its declared ranks).
FitSpace fit_space(const Recipe& base, const PluginRegistry& registry,
                   const std::vector<std::string>& keep, const std::vector<std::string>& without,
                   const std::vector<std::string>& change, std::vector<int> lora_ranks,
                   bool adapters_instead, int ranks);

// Every consistent choice (an added plugin that does something, no two
// settings claiming one resource, what a value needs in the stack, frozen
// weights only beside adapters), the most memory-saving first.
std::vector<FitChoice> enumerate_choices(const FitSpace& space);

// Fills a choice's description, what it changes in the maths and its penalty.
void finish_choice(const FitSpace& space, FitChoice& choice);

// The same training target with no memory strategy (the slowdown's base).
FitChoice plain_choice(const FitSpace& space, const FitChoice& choice);

// `base` with the space's plugins as the choice has them (keys the user set
// in a replaced table, such as LoRA targets, are kept).
Recipe apply_choice(const Recipe& base, const FitSpace& space, const FitChoice& choice);

}  // namespace tightfit::host
