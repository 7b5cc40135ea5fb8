// Mixed precision as a strategy plugin.
//
//   mode = "autocast": weights stay fp32 (they are the master copy); every
//     stage's forward and recompute runs under LibTorch's autocast, so matrix
//     products and their saved activations are bf16, reductions stay fp32.
//   mode = "bf16": weights are stored bf16 (half the bytes); the kernel's
//     optimizer keeps fp32 state and updates in fp32, rounding once a step.
//
// fp16 needs loss scaling, which only CUDA runs need; it is refused here.
#include <ATen/autocast_mode.h>

#include <memory>

#include "tightfit/plugin_sdk.hpp"

namespace {

struct Precision {
  tf_sdk::Host host;
  bool autocast = true;
  at::ScalarType dtype = at::kBFloat16;
  int depth = 0;  // nested stage events (a recompute inside backward)
};

at::DeviceType device_type(const tf_sdk::Host& host) { return at::Device(host.run_info().device).type(); }

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Precision>(Precision{tf_sdk::Host(api, ctx)});
    s->autocast = s->host.get_string("mode") == "autocast";
    if (s->host.get_string("dtype") == "fp16")
      throw std::invalid_argument("precision: fp16 needs dynamic loss scaling, which is not implemented; use dtype = \"bf16\"");
    *out = s.release();
    return TF_OK;
  });
}

void destroy(void* state) { delete static_cast<Precision*>(state); }

tf_status params_ready(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Precision*>(state);
  if (s->autocast) return TF_OK;
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    for (const std::string& name_s : s->host.param_names()) {
      const char* name = name_s.c_str();
      const tf_param_info info = s->host.param_info(name_s);
      if (info.format != TF_FORMAT_DENSE || info.dtype != TF_DTYPE_F32) continue;
      tf_tensor stored = nullptr;
      s->host.check(api->param_storage(ctx, name, &stored));
      s->host.check(api->memory_push_category(ctx, (info.flags & TF_PARAM_ADAPTER) ? TF_MEM_ADAPTERS : TF_MEM_WEIGHTS));
      at::Tensor low = tf_sdk::take(stored).detach().to(s->dtype);
      api->memory_pop_category(ctx);
      s->host.check(api->param_set_storage(ctx, name, reinterpret_cast<tf_tensor>(&low), TF_FORMAT_DENSE, info.residency));
    }
    return TF_OK;
  });
}

// Autocast on from the start of a stage's forward (or recompute) to its end.
tf_status stage_event(void* state, tf_host_context* ctx, const tf_stage_event* ev) {
  auto* s = static_cast<Precision*>(state);
  if (!s->autocast || ev->phase == TF_PHASE_BACKWARD) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const at::DeviceType dev = device_type(s->host);
    if (ev->begin) {
      if (s->depth++ == 0) {
        at::autocast::set_autocast_dtype(dev, s->dtype);
        at::autocast::set_autocast_enabled(dev, true);
      }
    } else if (--s->depth == 0) {
      at::autocast::set_autocast_enabled(dev, false);
      at::autocast::clear_cache();
    }
    return TF_OK;
  });
}

tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model, tf_memory_estimate* out) {
  auto* s = static_cast<Precision*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    if (s->autocast) out->delta_bytes[TF_TIER_DEVICE][TF_MEM_ACTIVATIONS] = -model->activation_bytes / 2;
    else {
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_WEIGHTS] = -model->param_bytes / 2;
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_GRADS] = -2 * model->n_trainable;
    }
    out->time_factor = 0;
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("mode", TF_VALUE_STRING, "\"autocast\"",
                "autocast: fp32 weights, low-precision compute; bf16: bf16 weights, fp32 optimizer state", 1, 0,
                "autocast|bf16"),
    tf_sdk::key("dtype", TF_VALUE_STRING, "\"bf16\"", "low-precision type", 1, 0, "bf16|fp16"),
};

tf_strategy_vtable make_vtable() {
  tf_strategy_vtable v{};
  v.struct_size = sizeof v;
  v.create = create;
  v.destroy = destroy;
  v.params_ready = params_ready;
  v.stage_event = stage_event;
  v.estimate_memory = estimate_memory;
  return v;
}
const tf_strategy_vtable kVtable = make_vtable();

const tf_plugin_descriptor kDescriptor = {
    sizeof(tf_plugin_descriptor), TF_ABI_VERSION, TF_PLUGIN_STRATEGY, "precision", "1.0.0",
    "bf16 autocast with fp32 master weights, or bf16 weights with fp32 optimizer state", TORCH_VERSION, 0, kKeys,
    sizeof(kKeys) / sizeof(kKeys[0]), &kVtable, {}};

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
