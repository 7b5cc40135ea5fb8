// Optimizer-in-backward (as LOMO and torchtune do): each stage's parameters
// are updated as soon as the stage's backward has finished, and their
// gradients are freed at once, so the full set of gradients never exists.
//
// Gradient clipping needs the global norm, which is only known after the
// whole backward. `clip = "previous"` scales this step's gradients by
// min(1, max_norm / norm of the previous step's gradients) — a one-step-late
// clip that tracks the true norm closely when it changes slowly; the first
// step is not clipped. `clip = "none"` turns it off (then the updates are
// exactly those of the plain run). The norm of each step is logged as
// fused_update.grad_norm.
//
// Under gradient accumulation (a schedule that declares micro-batches, such
// as `accumulate`), gradients build up as usual over the first micro-batches
// and each parameter is updated — and its gradient freed — during the last
// micro-batch's backward, from the accumulated gradient. The full gradients
// then exist between micro-batches (accumulation needs them) but never all at
// once during the last backward and the update.
#include <algorithm>
#include <cmath>
#include <memory>

#include "tightfit/plugin_sdk.hpp"

namespace {

struct FusedUpdate {
  tf_sdk::Host host;
  bool clip = true;
  double max_norm = 1.0;
  double previous_norm = -1;  // < 0: none yet
  // This step's gradients' squared norms so far, summed on the device and
  // read with the kernel's one read of the step (read_later, asked in the
  // update's grad_norm_sq; a read per parameter would wait for the device
  // each time, and a read of its own would be the step's second).
  at::Tensor sum_sq;
  double sum_sq_read = 0;
  bool sum_sq_asked = false;
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<FusedUpdate>(FusedUpdate{tf_sdk::Host(api, ctx)});
    s->clip = s->host.get_string("clip") == "previous";
    s->max_norm = s->host.get_double("max_norm");
    *out = s.release();
    return TF_OK;
  });
}

tf_status grad_ready(void* state, tf_host_context* ctx, const char* name, tf_tensor grad_h) {
  auto* s = static_cast<FusedUpdate*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const auto [index, count] = s->host.micro_batch();
    if (index + 1 < count) return TF_NOT_HANDLED;  // keep accumulating
    const at::Tensor& grad = tf_sdk::borrow(grad_h);
    const at::Tensor n = grad.detach().norm().to(at::kDouble);
    s->sum_sq = s->sum_sq.defined() ? s->sum_sq + (n * n).to(s->sum_sq.device()) : n * n;
    double scale = 1.0;
    if (s->clip && s->previous_norm > s->max_norm) scale = s->max_norm / (s->previous_norm + 1e-6);
    s->host.optimizer_apply(name, grad, scale);
    return TF_OK;  // consumed: the kernel frees the gradient
  });
}

// It holds no gradient (each went into its update in backward), so it adds
// nothing to the norm; its own sum is read with the kernel's.
tf_status grad_norm_sq(void* state, tf_host_context* ctx, double*) {
  auto* s = static_cast<FusedUpdate*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    if (s->sum_sq.defined() && !s->sum_sq_asked)
      s->sum_sq_asked = s->host.read_later(s->sum_sq, &s->sum_sq_read);
    return TF_OK;
  });
}

tf_status step_end(void* state, tf_host_context* ctx, int64_t, double) {
  auto* s = static_cast<FusedUpdate*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    // (A step without an update, or an older host: read here.)
    const double sq = !s->sum_sq.defined() ? 0.0
                      : s->sum_sq_asked    ? s->sum_sq_read
                                           : s->sum_sq.item<double>();
    s->previous_norm = std::sqrt(sq);
    s->sum_sq = at::Tensor();
    s->sum_sq_asked = false;
    s->host.log_metric("grad_norm", s->previous_norm);
    return TF_OK;
  });
}

tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<FusedUpdate*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->host.save_double("previous_norm", s->previous_norm);
    return TF_OK;
  });
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<FusedUpdate*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->previous_norm = s->host.saved_double("previous_norm");
    return TF_OK;
  });
}

// A gradient lives only until its parameter is updated: at most about the
// largest one at a time (measured), instead of all of them.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<FusedUpdate*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    int64_t all = 0, largest = 0;
    for (const std::string& name : s->host.param_names()) {
      const tf_param_info info = s->host.param_info(name);
      if (!info.trainable) continue;
      const int64_t bytes = tf_sdk::dense_bytes(info);
      all += bytes;
      largest = std::max(largest, bytes);
    }
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_GRADS] = largest - all;
    out->time_factor = 1.0;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    return TF_OK;
  });
}

// `tightfit fit` may add it (clipping by the previous step's norm), not
// beside micro-batches: planned beside them it misses by 14% (gpt2-124m,
// micro_batches = 4, 2026-12-05).
const tf_plugin_search kSearch = {.struct_size = sizeof(tf_plugin_search),
                                  .label = "fused update",
                                  .approximation = "clip by last norm",
                                  .quality_penalty = 0.1,
                                  // Its saving is the gradients' lifetime, which
                                  // micro-batches extend (its estimate does not see them).
                                  .claims = "gradient lifetime",
                                  .stack_order = 60};

const tf_config_key kKeys[] = {
    tf_sdk::key("clip", TF_VALUE_STRING, "\"previous\"",
                "global-norm clipping by the previous step's norm, or none", 1, 0, "previous|none"),
    tf_sdk::key("max_norm", TF_VALUE_FLOAT, "1.0", "clip threshold", 0, 1e9),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<FusedUpdate>,
                                    .step_end = step_end,
                                    .grad_ready = grad_ready,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state,
                                    .grad_norm_sq = grad_norm_sq};

const tf_plugin_descriptor kDescriptor =
    tf_sdk::searched(tf_sdk::describe(TF_PLUGIN_STRATEGY, "fused_update", "1.0.0",
                                      "optimizer-in-backward: update each stage's parameters "
                                      "when its backward ends, free their gradients",
                                      kKeys, &kVtable),
                     kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
