// MeZO (Malladi et al., 2023): zeroth-order training in inference memory.
// Each step draws a direction z ~ N(0, I) over every trainable parameter
// from a seed, measures the loss at theta + eps z and theta - eps z on the
// same batch (two forward passes, no backward: no activations kept, no
// gradients, no optimizer state), and moves theta by
//   -lr * (L(theta + eps z) - L(theta - eps z)) / (2 eps) * z,
// regenerating z from its seed instead of storing it (the kernel's
// perturb_params service). The projected gradient is logged as
// mezo.projected_grad; a non-finite one skips the update. The seed depends
// only on the run's seed and the step, so ranks agree and a resumed run
// continues the same sequence. The learning rate follows the same warmup and
// decay as the other schedules; there is no weight decay or momentum
// (MeZO-SGD).
#include <cmath>
#include <memory>

#include "tightfit/lr_schedule.hpp"

namespace {

struct Mezo {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  double eps = 1e-3;
  uint64_t seed = 0;
  int64_t skipped = 0;
};

// SplitMix64: well-spread seeds from (run seed, step).
uint64_t step_seed(uint64_t seed, int64_t step) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Mezo>(Mezo{tf_sdk::Host(api, ctx)});
    s->lr = tf_sdk::LrSchedule::read(s->host);
    s->eps = s->host.get_double("eps");
    s->seed = s->host.run_info().seed;
    *out = s.release();
    return TF_OK;
  });
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<Mezo*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    const double lr = s->lr.apply(s->host, step, total);
    const uint64_t seed = step_seed(s->seed, step);
    const tf_sdk::Batch batch(s->host);
    auto loss_at = [&](double shift) {
      s->host.perturb_params(seed, shift);
      return batch.forward();
    };
    const tf_pass_result plus = loss_at(s->eps);
    const tf_pass_result minus = loss_at(-2 * s->eps);
    s->host.perturb_params(seed, s->eps);  // back to theta
    const double g = (plus.loss - minus.loss) / (2 * s->eps);
    if (std::isfinite(g)) {
      s->host.perturb_params(seed, -lr * g);
    } else {
      ++s->skipped;
      s->host.log(TF_LOG_WARN, "mezo: step " + std::to_string(step + 1) +
                                   ": the loss is not finite; no update (" +
                                   std::to_string(s->skipped) + " skipped so far)");
    }
    s->host.log_metric("projected_grad", g);
    out->loss = 0.5 * (plus.loss + minus.loss);
    out->n_tokens = plus.n_tokens;
    out->backward_passes = 0;
    out->forward_passes = 2;
    out->lr = lr;
    out->phase = "mezo";
    return TF_OK;
  });
}

// No gradients, no optimizer state, no activations kept for backward.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Mezo*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_GRADS] = -4 * model->n_trainable;
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OPTIMIZER] = -8 * model->n_trainable;
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_ACTIVATIONS] = -model->activation_bytes;
    out->time_factor = 2.0 / 3.0;  // two forwards against forward + backward (~3 forwards)
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::key("eps", TF_VALUE_FLOAT, "1e-3", "perturbation scale", 1e-12, 1e3),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Mezo>,
                                    .run_step = run_step,
                                    .estimate_memory = estimate_memory,
                                    .save_state = tf_sdk::save_skipped_state<Mezo>,
                                    .load_state = tf_sdk::load_skipped_state<Mezo>};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "mezo", "1.0.0",
    "zeroth-order (MeZO): two seeded forward passes a step, no backward", kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
