// 8-bit AdamW as a strategy of its own: the run's AdamW (its lr schedule,
// betas, eps, weight decay, clipping) with the two moments of every trainable
// weight kept as block-wise int8 codes (adamw8_state.hpp), two bytes a value
// instead of eight, on whatever the weights are: a full fine-tune, LoRA's
// adapters, a quantized base's adapters. quantize's optimizer_state = "int8"
// runs the same code.
#include <memory>
#include <string>

#include "adamw8_state.hpp"
#include "tightfit/plugin_sdk.hpp"

namespace {

struct AdamW8 {
  tf_sdk::Host host;
  std::unique_ptr<adamw8::State> state;
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<AdamW8>(AdamW8{tf_sdk::Host(api, ctx), nullptr});
    s->state = std::make_unique<adamw8::State>(s->host.get_int("state_block_size"));
    *out = s.release();
    return TF_OK;
  });
}

tf_status optimizer_step_param(void* state, tf_host_context* ctx, const char* name,
                               tf_tensor param_h, tf_tensor grad_h, double lr) {
  auto* s = static_cast<AdamW8*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    return s->state->step(s->host, name, tf_sdk::borrow(param_h), tf_sdk::borrow(grad_h), lr);
  });
}

tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<AdamW8*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->state->save(s->host);
    return TF_OK;
  });
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<AdamW8*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->state->load(s->host);
    return TF_OK;
  });
}

// Two int8 moments and their fp32 block scales in place of AdamW's two fp32
// moments, for every trainable value.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<AdamW8*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    int64_t trainable = 0;
    for (const std::string& name : s->host.param_names()) {
      const tf_param_info info = s->host.param_info(name);
      if (info.trainable) trainable += info.numel;
    }
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OPTIMIZER] = s->state->optimizer_delta(trainable);
    out->time_factor = 0;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    return TF_OK;
  });
}

// `tightfit fit` may add it: 8-bit moments, which another strategy keeping
// the optimizer state (offload's tier) would take over.
const tf_plugin_search kSearch = {.struct_size = sizeof(tf_plugin_search),
                                  .label = "8-bit adam",
                                  .approximation = "8-bit state",
                                  .quality_penalty = 0.3,
                                  .claims = "optimizer state",
                                  .stack_order = 20};

const tf_config_key kKeys[] = {
    tf_sdk::key("state_block_size", TF_VALUE_INT, "256", "values per absmax block of the moments",
                2, 65536),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<AdamW8>,
                                    .optimizer_step_param = optimizer_step_param,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state};

const tf_plugin_descriptor kDescriptor = tf_sdk::searched(
    tf_sdk::describe(TF_PLUGIN_STRATEGY, "adamw8", "1.0.0",
                     "8-bit AdamW: the optimizer's two moments as block-wise int8 codes "
                     "(bitsandbytes' blockwise 8-bit optimizers), a quarter of their memory",
                     kKeys, &kVtable),
    kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
