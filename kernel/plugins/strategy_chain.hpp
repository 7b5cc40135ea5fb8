// The one place the kernel calls strategy hooks. Strategies handle every
// hook in recipe order ([[strategy]] entries top to bottom), in one of two
// ways the ABI documents per hook:
//
//   each           every strategy with the hook is called (step_begin,
//                  stage_event, loss_scale, apply_held_grads, ...); a value
//                  threaded through the chain (linear_extend's y,
//                  export_weight's dense value) reaches the next strategy
//                  as the previous one left it;
//   first_handled  strategies are asked until one returns TF_OK; TF_NOT_HANDLED
//                  passes to the next (fetch_weight, grad_ready,
//                  optimizer_step_param, pack_activation).
//
// Any other status stops the chain as a PluginCallError naming the plugin
// and the hook (check_plugin_status). Vtables are the host's own zero-filled
// copies (plugin_loader), so an absent hook is NULL whatever the plugin's ABI
// minor version. Tensor results are adopted here, once: a new tensor handed
// back is owned by the kernel from then on.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "memory_accounting.hpp"
#include "plugin_call_scope.hpp"
#include "plugin_hooks.hpp"
#include "plugin_set.hpp"
#include "tensor_handle.hpp"

namespace tightfit {

// Calls one strategy hook through the one door into plugins (plugin_call).
template <class Fn, class... Args>
tf_status guarded_call(const PluginInstance& s, const char* name, Fn fn, Args... args) {
  return plugin_call(s, name, [&] { return fn(s.state, s.ctx.get(), args...); });
}

// A model's or a schedule's hook through the same door, named by the hook
// list: call_hook(model, model.plugin->model(), TF_MODEL_HOOK(decode), ...).
// A hook the plugin lacks is a PluginCallError naming it; the status is the
// caller's to check (some are expected, as TF_ERR_NON_FINITE).
template <class Vtable, class Fn, class... Args>
tf_status call_hook(const PluginInstance& inst, const Vtable* vt, Fn Vtable::*hook,
                    const char* name, Args... args) {
  const Fn fn = vt ? vt->*hook : nullptr;
  if (!fn) throw PluginCallError("plugin \"" + inst.plugin->name + "\" has no " + name + " hook");
  return guarded_call(inst, name, fn, args...);
}

// Whether an argument of a hook is the handle `out` (arguments that are no
// tensor handle never are).
template <class A>
bool same_handle(tf_tensor out, A arg) {
  if constexpr (std::is_same_v<A, tf_tensor>)
    return out == arg;
  else
    return false;
}

class StrategyChain {
 public:
  explicit StrategyChain(std::vector<PluginInstance>& strategies) : strategies_(strategies) {}

  // Calls `hook` of every strategy that has it.
  template <class Fn, class... Args>
  void each(Fn tf_strategy_vtable::*hook, const char* name, Args... args) {
    for (PluginInstance& s : strategies_)
      if (Fn fn = s.plugin->strategy()->*hook)
        check_plugin_status(guarded_call(s, name, fn, args...), s, name);
  }

  // Calls `hook` of every strategy that has it, handing each status to
  // on_status(index, status) (configure: a bad value is a recipe error).
  template <class Fn, class OnStatus, class... Args>
  void each_with(Fn tf_strategy_vtable::*hook, const char* name, OnStatus&& on_status,
                 Args... args) {
    for (size_t i = 0; i < strategies_.size(); ++i) {
      PluginInstance& s = strategies_[i];
      if (Fn fn = s.plugin->strategy()->*hook) on_status(i, guarded_call(s, name, fn, args...));
    }
  }

  // Asks in order until one strategy returns TF_OK: its index, or -1.
  template <class Fn, class... Args>
  int first_handled(Fn tf_strategy_vtable::*hook, const char* name, Args... args) {
    for (size_t i = 0; i < strategies_.size(); ++i) {
      PluginInstance& s = strategies_[i];
      Fn fn = s.plugin->strategy()->*hook;
      if (!fn) continue;
      const tf_status st = guarded_call(s, name, fn, args...);
      if (st == TF_OK) return static_cast<int>(i);
      if (st != TF_NOT_HANDLED) check_plugin_status(st, s, name);
    }
    return -1;
  }

  // first_handled for a hook whose last argument is a tensor out: the first
  // strategy's tensor, or nullopt when none handled it.
  template <class Fn, class... Args>
  std::optional<at::Tensor> first_tensor(Fn tf_strategy_vtable::*hook, const char* name,
                                         Args... args) {
    for (PluginInstance& s : strategies_) {
      Fn fn = s.plugin->strategy()->*hook;
      if (!fn) continue;
      tf_tensor out = nullptr;
      const tf_status st = guarded_call(s, name, fn, args..., &out);
      if (st == TF_OK) return adopt_handle(returned(out, s, name, args...));
      if (st != TF_NOT_HANDLED) check_plugin_status(st, s, name);
    }
    return std::nullopt;
  }

  // each for a hook that may replace `value` (its last two arguments are the
  // value, borrowed, and a tensor out): TF_OK hands the next strategy the new
  // value, TF_NOT_HANDLED leaves it.
  template <class Fn, class... Args>
  void thread_tensor(Fn tf_strategy_vtable::*hook, const char* name, at::Tensor& value,
                     Args... args) {
    for (PluginInstance& s : strategies_) {
      Fn fn = s.plugin->strategy()->*hook;
      if (!fn) continue;
      tf_tensor out = nullptr;
      const tf_tensor lent = borrow_handle(value);
      const tf_status st = guarded_call(s, name, fn, args..., lent, &out);
      if (st == TF_OK)
        value = adopt_handle(returned(out, s, name, lent));
      else if (st != TF_NOT_HANDLED)
        check_plugin_status(st, s, name);
    }
  }

  // A plugin's tensor out after TF_OK: a NULL one is the plugin's error, and
  // so is one of the handles the host lent for the call (`lent`): adopting
  // it would free a tensor the host still owns.
  template <class... Lent>
  static tf_tensor returned(tf_tensor out, const PluginInstance& s, const char* name,
                            Lent... lent) {
    if (out == nullptr)
      throw PluginCallError(s.ctx->role + " plugin \"" + s.plugin->name +
                            "\" returned TF_OK from " + name +
                            " but no tensor; return TF_NOT_HANDLED to pass");
    if ((same_handle(out, lent) || ...))
      throw PluginCallError(s.ctx->role + " plugin \"" + s.plugin->name + "\" returned from " +
                            name +
                            " the tensor handle the host lent it for the call; a tensor out "
                            "must be a new handle (return a new reference to the tensor)");
    return out;
  }

 private:
  std::vector<PluginInstance>& strategies_;
};

}  // namespace tightfit
