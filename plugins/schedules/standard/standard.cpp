// The standard schedule: every step is forward, backward, update, with the
// learning rate warmed up linearly and then decayed (cosine, linear or none).
#include <memory>

#include "tightfit/lr_schedule.hpp"

namespace {

struct Standard {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  int64_t skipped = 0;
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Standard>(Standard{tf_sdk::Host(api, ctx)});
    s->lr = tf_sdk::LrSchedule::read(s->host);
    *out = s.release();
    return TF_OK;
  });
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<Standard*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    const double lr = s->lr.apply(s->host, step, total);
    s->host.zero_grad();
    // The loss is read with the update's gradient norm: one read a step.
    tf_pass_result pass{};
    tf_sdk::Batch(s->host).forward_backward_deferred(1.0, &pass);
    tf_sdk::step_or_skip(s->host, step, s->skipped);
    out->loss = pass.loss;
    out->n_tokens = pass.n_tokens;
    out->backward_passes = 1;
    out->forward_passes = 1;
    out->lr = lr;
    out->phase = "full";
    return TF_OK;
  });
}

// The plain step the plan's baseline already is.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Standard*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->time_factor = 1.0;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Standard>,
                                    .run_step = run_step,
                                    .estimate_memory = estimate_memory,
                                    .save_state = tf_sdk::save_skipped_state<Standard>,
                                    .load_state = tf_sdk::load_skipped_state<Standard>};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "standard", "1.0.0",
    "forward, backward, update every step; warmup then cosine/linear decay", kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
