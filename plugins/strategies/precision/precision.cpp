// Mixed precision as a strategy plugin.
//
//   mode = "autocast": weights stay fp32 (they are the master copy); every
//     stage's forward and recompute runs under LibTorch's autocast, so matrix
//     products and their saved activations are bf16, reductions stay fp32.
//   mode = "bf16": weights are stored bf16 (half the bytes); the kernel's
//     optimizer keeps fp32 state and updates in fp32, rounding once a step.
//
// dtype = "fp16" (autocast only) adds dynamic loss scaling, as
// torch.amp.GradScaler does: the loss is multiplied by `init_scale` before
// backward so that small fp16 gradients do not flush to zero; the kernel
// divides the gradients by it again before clipping and the update; a step
// whose gradients overflow is skipped and the scale halved, and after
// `growth_interval` finite steps in a row it doubles. The scale is logged as
// precision.loss_scale and saved in checkpoints. fp16 weights (mode = "bf16"
// with dtype = "fp16") are refused: updates below fp16's spacing would be
// lost without an fp32 master copy.
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tightfit/plugin_sdk.hpp"

namespace {

struct Precision {
  tf_sdk::Host host;
  bool autocast = true;
  at::ScalarType dtype = at::kBFloat16;
  int depth = 0;  // nested stage events (a recompute inside backward)
  // Dynamic loss scaling (fp16).
  bool scaling = false;
  double scale = 65536.0;
  int64_t growth_interval = 2000;
  int64_t good_steps = 0;  // finite steps since the last change
  int64_t overflows = 0;
};

at::DeviceType device_type(const tf_sdk::Host& host) {
  return at::Device(host.run_info().device).type();
}

// How many times an fp32 matmul's time a 16-bit one takes on this CPU
// (256x256x256): the best of five timed runs of each, interleaved so that a
// busy machine slows both alike.
double matmul_time_ratio(at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  const at::Tensor a = at::randn({256, 256}), b = at::randn({256, 256});
  const at::Tensor a16 = a.to(dtype), b16 = b.to(dtype);
  auto seconds = [](const at::Tensor& x, const at::Tensor& y) {
    int reps = 0;
    double s = 0;
    const auto t0 = std::chrono::steady_clock::now();
    do {
      at::Tensor c = at::mm(x, y);
      ++reps;
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (s < 0.01);
    return s / reps;
  };
  seconds(a, b);  // warm-up: first-call set-up and kernel selection
  seconds(a16, b16);
  double fp32 = 1e30, low = 1e30;
  for (int trial = 0; trial < 5; ++trial) {
    fp32 = std::min(fp32, seconds(a, b));
    low = std::min(low, seconds(a16, b16));
  }
  return low / fp32;
}

// Measured once per process and type: it is the machine's, and every
// session that composes precision (an A/B run, the tests) would pay again.
double machine_matmul_time_ratio(at::ScalarType dtype) {
  static std::mutex m;
  static std::map<at::ScalarType, double> measured;
  std::lock_guard<std::mutex> lock(m);
  const auto it = measured.find(dtype);
  return it != measured.end() ? it->second : measured[dtype] = matmul_time_ratio(dtype);
}

// A CPU without native 16-bit arithmetic (no AVX-512 BF16 or AMX) emulates
// it, and a 16-bit step is then several times slower than fp32 (15x on an
// AVX2-only EPYC): said once, at set-up, with the ratio measured here.
void report_cpu_16bit_speed(const Precision& s) {
  const char* name = s.dtype == at::kHalf ? "fp16" : "bf16";
  // Rounded as printed, so that the notice and the warning agree.
  const double ratio = std::round(machine_matmul_time_ratio(s.dtype) * 10) / 10;
  char figure[64];
  std::snprintf(figure, sizeof figure, "%.1fx", ratio);
  s.host.log(TF_LOG_INFO,
             std::string("a ") + name + " matmul takes " + figure +
                 " the time of an fp32 one on this CPU (256x256, measured in this process)");
  if (ratio > 1.5)
    s.host.log(TF_LOG_WARN,
               std::string("this CPU emulates ") + name + " arithmetic (its matmuls run " + figure +
                   " slower than fp32), so this recipe saves memory but "
                   "trains slower than without precision; leave the strategy out on this machine "
                   "unless memory is what you lack (`tightfit fit` prices it from the same "
                   "rates)");
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Precision>(Precision{tf_sdk::Host(api, ctx)});
    s->autocast = s->host.get_string("mode") == "autocast";
    if (s->host.get_string("dtype") == "fp16") {
      if (!s->autocast)
        throw std::invalid_argument(
            "precision: fp16 weights (mode = \"bf16\", dtype = \"fp16\") would lose updates "
            "below fp16's spacing; use mode = \"autocast\" with dtype = \"fp16\" (fp32 "
            "master weights, loss scaling) or dtype = \"bf16\"");
      s->dtype = at::kHalf;
      s->scaling = true;
      s->scale = s->host.get_double("init_scale");
      s->growth_interval = s->host.get_int("growth_interval");
    }
    if (device_type(s->host) == at::kCPU && !s->host.run_info().dry_run) report_cpu_16bit_speed(*s);
    *out = s.release();
    return TF_OK;
  });
}

tf_status params_ready(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Precision*>(state);
  if (s->autocast) return TF_OK;
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    for (const std::string& name_s : s->host.param_names()) {
      const tf_param_info info = s->host.param_info(name_s);
      if (info.format != TF_FORMAT_DENSE || info.dtype != TF_DTYPE_F32) continue;
      // A weight another strategy keeps on a host or disk tier is fetched
      // from there as it is stored: it cannot be converted here.
      if (info.residency != TF_TIER_DEVICE)
        throw std::invalid_argument(
            "precision: mode = \"bf16\" stores weights in 16 bits on the device, but \"" + name_s +
            "\" is kept on the " + (info.residency == TF_TIER_DISK ? "disk" : "host") +
            " tier by another strategy (offload params); use mode = \"autocast\", quantize "
            "those weights, or leave them on the device");
      at::Tensor stored = s->host.param_storage(name_s);
      at::Tensor low;
      {
        const tf_sdk::MemoryCategory scope(
            s->host, (info.flags & TF_PARAM_ADAPTER) ? TF_MEM_ADAPTERS : TF_MEM_WEIGHTS);
        low = std::exchange(stored, at::Tensor()).detach().to(s->dtype);
      }
      s->host.set_param_storage(name_s, low, TF_FORMAT_DENSE, info.residency);
    }
    return TF_OK;
  });
}

// Autocast on from the start of a stage's forward (or recompute) to its end.
tf_status stage_event(void* state, tf_host_context* ctx, const tf_stage_event* ev) {
  auto* s = static_cast<Precision*>(state);
  if (!s->autocast || (ev->phase != TF_PHASE_FORWARD && ev->phase != TF_PHASE_RECOMPUTE))
    return TF_OK;
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

tf_status loss_scale(void* state, tf_host_context*, double* scale) {
  auto* s = static_cast<Precision*>(state);
  if (s->scaling) *scale *= s->scale;
  return TF_OK;
}

// Back off on overflow, grow after growth_interval finite steps.
tf_status loss_scale_update(void* state, tf_host_context* ctx, int32_t finite) {
  auto* s = static_cast<Precision*>(state);
  if (!s->scaling) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    if (!finite) {
      ++s->overflows;
      s->scale = std::max(s->scale * 0.5, 1.0 / 65536);
      s->good_steps = 0;
      s->host.log(TF_LOG_INFO, "fp16 gradients overflowed; update skipped, loss scale now " +
                                   std::to_string(s->scale));
    } else if (++s->good_steps >= s->growth_interval) {
      s->scale = std::min(s->scale * 2.0, 16777216.0 * 65536.0);
      s->good_steps = 0;
    }
    s->host.log_metric("loss_scale", s->scale);
    s->host.log_metric("overflows", static_cast<double>(s->overflows));
    return TF_OK;
  });
}

tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Precision*>(state);
  if (!s->scaling) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->host.save_double("loss_scale", s->scale);
    s->host.save_double("good_steps", static_cast<double>(s->good_steps));
    s->host.save_double("overflows", static_cast<double>(s->overflows));
    return TF_OK;
  });
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Precision*>(state);
  if (!s->scaling) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->scale = s->host.saved_double("loss_scale");
    s->good_steps = static_cast<int64_t>(s->host.saved_double("good_steps"));
    s->overflows = static_cast<int64_t>(s->host.saved_double("overflows"));
    return TF_OK;
  });
}

// Whether the model computes in fp32: its embedding matrix (the residual
// stream's dtype; quantize and LoRA leave it dense) is fp32.
bool model_activations_fp32(tf_sdk::Host& host) {
  for (const std::string& name : host.param_names()) {
    const tf_param_info info = host.param_info(name);
    if (info.ndim != 2 || (info.flags & TF_PARAM_ADAPTER)) continue;
    if (info.stage < 0 || host.stage_info(info.stage).kind == TF_STAGE_EMBED)
      return info.dtype == TF_DTYPE_F32;
  }
  return true;
}

tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Precision*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    // The models declare their activations in their weights' dtype; what
    // 16-bit compute keeps of fp32 ones, measured on the built-in models
    // (norms, softmax statistics and WKV stay fp32): autocast 0.78-0.86 of
    // it, bf16 weights 0.51-0.74.
    if (s->autocast) {
      // A model already in 16 bits (model.dtype = "bf16", as QLoRA recipes
      // keep it) declared 16-bit activations, which autocast leaves as they
      // are: shrinking them again planned a 30B stack whose every second
      // block keeps its activations 10 MiB a kept block under (7-8% at 60
      // layers).
      if (model_activations_fp32(s->host))
        out->delta_bytes[TF_TIER_DEVICE][TF_MEM_ACTIVATIONS] = -model->activation_bytes / 5;
      // The head's matrix (its own, or the tied embedding) is cast to 16
      // bits for the logits and the cast is kept for the input's gradient:
      // vocabulary x width, which the ratio above (measured on small
      // vocabularies) does not hold. It lives from the head's forward to
      // its backward, where the plan's peak is.
      const int32_t head = model->n_stages - 1;
      // A frozen fp32 block weight is cast to 16 bits for each projection
      // (autocast caches only the casts of weights that train): the largest
      // such copy lives while its block computes, beside the weight itself.
      // One stored as NF4 is not cast: its fetch dequantizes straight to 16
      // bits (quantize.cpp), half the fp32 copy its strategy counted as the
      // block's workspace (4 bytes a value), which this one takes back: the
      // largest of the two 16-bit copies stays (a negative block_bytes; the
      // hosts of ABI 1.29 on add all strategies' up).
      int64_t largest_cast = 0, largest_nf4 = 0;
      for (const std::string& name : s->host.param_names()) {
        const tf_param_info info = s->host.param_info(name);
        if (info.ndim != 2 || info.dtype != TF_DTYPE_F32 || info.trainable || info.stage < 0 ||
            (info.flags & TF_PARAM_ADAPTER) ||
            s->host.stage_info(info.stage).kind != TF_STAGE_BLOCK ||
            s->host.stage_info(info.stage).skip)
          continue;
        const bool nf4 = s->host.has_param_plan() && s->host.planned(name).format == TF_FORMAT_NF4;
        int64_t& largest = nf4 ? largest_nf4 : largest_cast;
        largest = std::max(largest, 2 * info.numel);
      }
      if (TF_SDK_REACHES(out, tf_memory_estimate, block_bytes))
        out->block_bytes = std::max(largest_nf4, largest_cast) - 2 * largest_nf4;
      for (const std::string& name : s->host.param_names()) {
        const tf_param_info info = s->host.param_info(name);
        if (info.ndim != 2 || info.dtype != TF_DTYPE_F32 || (info.flags & TF_PARAM_ADAPTER) ||
            (info.stage >= 0 && info.stage != head))
          continue;
        if (s->host.has_param_plan() && s->host.planned(name).format != TF_FORMAT_DENSE) continue;
        // Fused with the loss (ABI 1.5), the cast lives while forward
        // computes the chunks only; whole, until the head's backward.
        const bool fused_head = TF_SDK_REACHES(model, tf_model_summary, logits_tokens) &&
                                model->logits_tokens > 0 &&
                                TF_SDK_REACHES(out, tf_memory_estimate, forward_bytes);
        (fused_head ? out->forward_bytes : out->delta_bytes[TF_TIER_DEVICE][TF_MEM_TRANSIENT]) +=
            2 * info.numel;
        // The 16-bit logits (vocabulary = the matrix's rows) stay alive
        // beside the fp32 copy the loss keeps, which the model declared and
        // the 16-bit ratio above must not shrink. A host that fuses the
        // projection with the loss (ABI 1.5) holds one chunk's, in forward.
        const int64_t tokens = model->batch_size * model->seq_len;
        const int64_t logits = info.shape[0] * (fused_head ? model->logits_tokens : tokens);
        if (fused_head)
          out->forward_bytes += 2 * logits;
        else
          out->delta_bytes[TF_TIER_DEVICE][TF_MEM_ACTIVATIONS] += 2 * logits + 4 * logits / 5;
      }
    } else {
      // fp32 weights still dense become bf16 (quantized ones stay as they
      // are, and so does the dtype blocks compute in with them: the 16-bit
      // activation ratio applies to the share of block weights converted).
      double converted_share = 1.0;
      if (s->host.has_param_plan()) {
        int64_t block = 0, converted = 0;
        for (const std::string& name : s->host.param_names()) {
          const tf_param_info info = s->host.param_info(name);
          if ((info.flags & TF_PARAM_ADAPTER) ||
              (info.stage >= 0 && s->host.stage_info(info.stage).skip))
            continue;
          const bool in_block =
              info.stage >= 0 && s->host.stage_info(info.stage).kind == TF_STAGE_BLOCK;
          if (in_block) block += info.numel;
          const tf_param_plan p = s->host.planned(name);
          if (info.dtype != TF_DTYPE_F32 || p.format != TF_FORMAT_DENSE) continue;
          s->host.plan(name, 2 * info.numel, p.format, p.tier);
          if (in_block) converted += info.numel;
        }
        if (block > 0)
          converted_share = static_cast<double>(converted) / static_cast<double>(block);
      } else {
        out->delta_bytes[TF_TIER_DEVICE][TF_MEM_WEIGHTS] = -model->param_bytes / 2;
      }
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_GRADS] = -2 * model->n_trainable;
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_ACTIVATIONS] = static_cast<int64_t>(
          -0.4 * converted_share * static_cast<double>(model->activation_bytes));
      // The update works on an fp32 copy of one parameter at a time.
      int64_t largest = 0;
      for (const std::string& name : s->host.param_names()) {
        const tf_param_info info = s->host.param_info(name);
        if (info.trainable) largest = std::max(largest, info.numel);
      }
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OPTIMIZER] = 4 * largest;
    }
    out->time_factor = 0;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    if (TF_SDK_REACHES(out, tf_memory_estimate, autocast_compute))
      out->autocast_compute = s->autocast ? 1 : 0;  // the casts each forward makes
    return TF_OK;
  });
}

// `tightfit fit` may add it. bf16 compute is not a saving everywhere: its
// casts of the weights can outweigh the halved activations.
const tf_plugin_search kSearch = {.struct_size = sizeof(tf_plugin_search), .stack_order = 30};
const tf_search_value kModes[] = {
    tf_sdk::search_value("\"autocast\"", "autocast", "bf16 compute", 0.3, TF_SEARCH_VALUE_MAY_COST),
    // Converted on the device as the stages are built: a block weight another
    // strategy keeps on a tier (offload params; norms are never quantized)
    // is refused when the run starts.
    tf_sdk::search_value("\"bf16\"", "bf16 weights", "bf16 weights", 1.0, 0,
                         "where block weights live"),
};
const tf_key_search kModeSearch = tf_sdk::key_search(kModes);

const tf_config_key kKeys[] = {
    tf_sdk::searched(tf_sdk::key("mode", TF_VALUE_STRING, "\"autocast\"",
                                 "autocast: fp32 weights, low-precision compute; bf16: bf16 "
                                 "weights, fp32 optimizer state",
                                 1, 0, "autocast|bf16"),
                     kModeSearch),
    tf_sdk::key("dtype", TF_VALUE_STRING, "\"bf16\"",
                "low-precision type (fp16: autocast with loss scaling)", 1, 0, "bf16|fp16"),
    tf_sdk::key("init_scale", TF_VALUE_FLOAT, "65536.0", "fp16: initial loss scale", 1e-8, 1e30),
    tf_sdk::key("growth_interval", TF_VALUE_INT, "2000",
                "fp16: finite steps before the loss scale doubles", 1, 1e12),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Precision>,
                                    .params_ready = params_ready,
                                    .stage_event = stage_event,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state,
                                    .loss_scale = loss_scale,
                                    .loss_scale_update = loss_scale_update};

const tf_plugin_descriptor kDescriptor = tf_sdk::searched(
    tf_sdk::describe(
        TF_PLUGIN_STRATEGY, "precision", "1.0.0",
        "bf16/fp16 autocast with fp32 master weights (fp16: dynamic loss scaling), or bf16 weights "
        "with fp32 optimizer state",
        kKeys, &kVtable),
    kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
