// The standard schedule: every step is forward, backward, update, with the
// learning rate warmed up linearly and then decayed (cosine, linear or none).
#include <cmath>
#include <memory>

#include "tightfit/plugin_sdk.hpp"

namespace {

struct Standard {
  tf_sdk::Host host;
  int64_t warmup = 0;
  std::string decay;
  double min_ratio = 0.1;
  int64_t skipped = 0;
};

// lr(step) = base * (step+1)/warmup during warmup, then decays to base * min_ratio.
double learning_rate(const Standard& s, double base, int64_t step, int64_t total) {
  if (step < s.warmup) return base * static_cast<double>(step + 1) / static_cast<double>(s.warmup);
  if (s.decay == "constant" || total <= s.warmup) return base;
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup) /
                                            static_cast<double>(std::max<int64_t>(1, total - s.warmup)));
  const double floor = base * s.min_ratio;
  if (s.decay == "linear") return floor + (base - floor) * (1.0 - progress);
  return floor + (base - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Standard>(Standard{tf_sdk::Host(api, ctx)});
    s->warmup = s->host.get_int("warmup_steps");
    s->decay = s->host.get_string("decay");
    s->min_ratio = s->host.get_double("min_lr_ratio");
    *out = s.release();
    return TF_OK;
  });
}

void destroy(void* state) { delete static_cast<Standard*>(state); }

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total, tf_step_result* out) {
  auto* s = static_cast<Standard*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    double base = 0;
    s->host.check(api->base_lr(ctx, &base));
    const double lr = learning_rate(*s, base, step, total);
    s->host.check(api->set_lr(ctx, lr));
    s->host.check(api->zero_grad(ctx));
    tf_batch batch{};
    batch.struct_size = sizeof batch;
    s->host.check(api->next_batch(ctx, &batch));
    tf_pass_result pass{};
    pass.struct_size = sizeof pass;
    const tf_status fb = api->forward_backward(ctx, &batch, 1.0, &pass);
    api->batch_release(ctx, &batch);
    s->host.check(fb);
    const tf_status st = api->optimizer_step(ctx);
    if (st == TF_ERR_NON_FINITE) {
      ++s->skipped;
      s->host.log(TF_LOG_WARN, "step " + std::to_string(step) + ": non-finite gradient, update skipped");
      api->log_metric(ctx, "skipped_steps", static_cast<double>(s->skipped));
    } else {
      s->host.check(st);
    }
    out->loss = pass.loss;
    out->n_tokens = pass.n_tokens;
    out->backward_passes = 1;
    out->forward_passes = 1;
    out->lr = lr;
    out->phase = "full";
    return TF_OK;
  });
}

tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Standard*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->host.check(s->host.api()->state_put_double(ctx, "skipped", static_cast<double>(s->skipped)));
    return TF_OK;
  });
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Standard*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    double v = 0;
    s->host.check(s->host.api()->state_get_double(ctx, "skipped", &v));
    s->skipped = static_cast<int64_t>(v);
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("warmup_steps", TF_VALUE_INT, "100", "linear warmup steps", 0, 1e12),
    tf_sdk::key("decay", TF_VALUE_STRING, "\"cosine\"", "decay after warmup", 1, 0, "cosine|linear|constant"),
    tf_sdk::key("min_lr_ratio", TF_VALUE_FLOAT, "0.1", "final lr as a fraction of optimizer.lr", 0, 1),
};

tf_schedule_vtable make_vtable() {
  tf_schedule_vtable v{};
  v.struct_size = sizeof v;
  v.create = create;
  v.destroy = destroy;
  v.run_step = run_step;
  v.save_state = save_state;
  v.load_state = load_state;
  return v;
}
const tf_schedule_vtable kVtable = make_vtable();

const tf_plugin_descriptor kDescriptor = {
    sizeof(tf_plugin_descriptor), TF_ABI_VERSION, TF_PLUGIN_SCHEDULE, "standard", "1.0.0",
    "forward, backward, update every step; warmup then cosine/linear decay", TORCH_VERSION, 0, kKeys,
    sizeof(kKeys) / sizeof(kKeys[0]), &kVtable, {}};

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
