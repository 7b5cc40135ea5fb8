// The plugin hooks, one list per vtable in the ABI's order. The one list
// drives what `plugins check` names (plugin_loader), how the kernel calls a
// strategy, model or schedule hook (TF_STRATEGY_HOOK, TF_MODEL_HOOK,
// TF_SCHEDULE_HOOK: a name not on the list does not compile, and the string
// is the field's own name), and test_abi_layout's check that
// the list holds every slot of each vtable, in order.
#pragma once

#include "tightfit/plugin_api.h"

// X(hook) for each hook of tf_strategy_vtable, after create and destroy.
#define TF_STRATEGY_HOOKS(X) \
  X(configure)               \
  X(params_ready)            \
  X(step_begin)              \
  X(step_end)                \
  X(stage_event)             \
  X(fetch_weight)            \
  X(release_weight)          \
  X(linear_extend)           \
  X(grad_ready)              \
  X(optimizer_step_param)    \
  X(estimate_memory)         \
  X(save_state)              \
  X(load_state)              \
  X(export_weight)           \
  X(export_adapter)          \
  X(loss_scale)              \
  X(loss_scale_update)       \
  X(stage_params_ready)      \
  X(pack_activation)         \
  X(unpack_activation)       \
  X(grad_norm_sq)            \
  X(apply_held_grads)        \
  X(drop_held_grads)         \
  X(set_adapters_enabled)    \
  X(want_weight)             \
  X(expect_weight)

// tf_model_vtable's hooks after create and destroy (then its data fields),
// and those after its data fields (1.27 on).
#define TF_MODEL_HOOKS(X) X(stage_forward) X(hf_config_json) X(decode) X(release_cache)
#define TF_MODEL_LATER_HOOKS(X) X(decode_rows)

// tf_schedule_vtable's hooks after create and destroy.
#define TF_SCHEDULE_HOOKS(X) \
  X(run_step) X(estimate_memory) X(save_state) X(load_state) X(eval_batch)

namespace tightfit::hooks {
#define TF_LISTED_STRATEGY_HOOK(name) inline constexpr bool strategy_##name = true;
TF_STRATEGY_HOOKS(TF_LISTED_STRATEGY_HOOK)
#undef TF_LISTED_STRATEGY_HOOK
}  // namespace tightfit::hooks

namespace tightfit::hooks {
#define TF_LISTED_MODEL_HOOK(name) inline constexpr bool model_##name = true;
TF_MODEL_HOOKS(TF_LISTED_MODEL_HOOK)
TF_MODEL_LATER_HOOKS(TF_LISTED_MODEL_HOOK)
#undef TF_LISTED_MODEL_HOOK
#define TF_LISTED_SCHEDULE_HOOK(name) inline constexpr bool schedule_##name = true;
TF_SCHEDULE_HOOKS(TF_LISTED_SCHEDULE_HOOK)
#undef TF_LISTED_SCHEDULE_HOOK
}  // namespace tightfit::hooks

// The hook and its name as StrategyChain takes them, for a listed hook only.
#define TF_STRATEGY_HOOK(name) \
  (static_cast<void>(::tightfit::hooks::strategy_##name), &tf_strategy_vtable::name), #name
// The same for the model's and the schedule's hooks (call_hook, strategy_chain.hpp).
#define TF_MODEL_HOOK(name) \
  (static_cast<void>(::tightfit::hooks::model_##name), &tf_model_vtable::name), #name
#define TF_SCHEDULE_HOOK(name) \
  (static_cast<void>(::tightfit::hooks::schedule_##name), &tf_schedule_vtable::name), #name
