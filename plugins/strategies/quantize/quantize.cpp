// Weight quantization as a strategy plugin: frozen block weights are stored
// compact and dequantized just in time when a stage asks for them.
//
//   int8: per output channel, q = round(127 w / absmax_row), w ~ q absmax_row / 127
//   nf4:  blocks of `block_size`, w / absmax_block rounded to the nearest of the
//         16 NormalFloat4 levels (Dettmers et al. 2023), two codes per byte;
//         with double quantization the block absmaxes are themselves stored as
//         int8 in groups of 256 around their mean, with one fp32 scale a group.
//   gguf: the GGUF weights file's own blocks (Q4_1, Q8_0, Q4_K, ...), kept
//         as the file holds them and decoded by the kernel's ggml
//         dequantizers: QLoRA on an ollama model's bytes, no re-quantizing.
//
// The kernel's linear keeps only the compact form for backward (it fetches the
// weight again there), so a dequantized copy lives only while a projection runs.
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "../adamw8/adamw8_state.hpp"
#include "nf4_codec.hpp"
#include "tightfit/plugin_sdk.hpp"

namespace {

constexpr int64_t kDoubleQuantGroup = 256;

// What dequantization needs beside the codes the store holds.
struct Quantized {
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  at::Tensor scale;        // int8: [out] fp32; nf4: block absmax, fp32 or int8 (double-quantized)
  at::Tensor scale_scale;  // nf4 double quantization: [groups] fp32
  at::Tensor scale_mean;   // [1] fp32
  std::string ggml_type;   // gguf: the blocks' type ("Q4_1"), decoded by the host
};

struct Quantize {
  tf_sdk::Host host;
  bool quantize_weights = true;
  // optimizer_state = "int8": the adamw8 strategy's state, kept here too.
  std::unique_ptr<adamw8::State> adam8;
  std::string format;
  int64_t block = 64;
  bool double_quant = true;
  std::map<std::string, Quantized> weights;
  int64_t dense_bytes = 0, compact_bytes = 0;  // of the weights quantized so far
  std::map<std::string, int64_t> ggml_types;   // gguf: weights kept, by type
};

// gguf: how the weights file stores `name`, or a refusal that says why it
// cannot be kept (another file format, no such matrix) and what to use.
tf_sdk::Host::SourceBlocks gguf_blocks(const Quantize& s, const std::string& name,
                                       bool with_bytes) {
  try {
    return s.host.source_blocks(name, with_bytes);
  } catch (const tf_sdk::HostError& e) {
    throw std::invalid_argument(
        std::string("quantize: format = \"gguf\" keeps the blocks of a GGUF [model] weights "
                    "file, and ") +
        e.what() + ". Use format = \"nf4\" or \"int8\" to quantize other weights");
  }
}

// ---- int8 ------------------------------------------------------------------
at::Tensor quantize_int8(const at::Tensor& w, Quantized& q) {
  at::Tensor absmax = w.abs().amax(1, true).clamp_min(1e-12);
  q.scale = (absmax / 127.0).squeeze(1).contiguous();
  return (w / absmax * 127.0).round().clamp(-127, 127).to(at::kChar);
}
at::Tensor dequantize_int8(const at::Tensor& codes, const Quantized& q) {
  return codes.to(at::kFloat) * q.scale.unsqueeze(1);
}

// ---- nf4 -------------------------------------------------------------------
at::Tensor nf4_block_absmax(const Quantized& q) {
  if (!q.scale_scale.defined()) return q.scale;
  const int64_t n = q.scale.numel();
  at::Tensor groups = q.scale.to(at::kFloat);
  const int64_t pad = (kDoubleQuantGroup - n % kDoubleQuantGroup) % kDoubleQuantGroup;
  groups = at::constant_pad_nd(groups, {0, pad}).view({-1, kDoubleQuantGroup});
  return (groups / 127.0 * q.scale_scale.unsqueeze(1)).flatten().slice(0, 0, n) + q.scale_mean;
}

// Codes in blocks (nf4_codec.hpp), then the block absmaxes double-quantized
// as int8 around their mean in groups of 256.
at::Tensor quantize_nf4(const Quantize& s, const at::Tensor& w, Quantized& q) {
  auto [packed, absmax] = nf4::encode(w, s.block);
  if (!s.double_quant) {
    q.scale = absmax.contiguous();
    return packed;
  }
  q.scale_mean = absmax.mean().reshape({1});
  at::Tensor centered = absmax - q.scale_mean;
  const int64_t m = centered.numel(),
                gpad = (kDoubleQuantGroup - m % kDoubleQuantGroup) % kDoubleQuantGroup;
  at::Tensor groups = at::constant_pad_nd(centered, {0, gpad}).view({-1, kDoubleQuantGroup});
  q.scale_scale = groups.abs().amax(1).clamp_min(1e-12).contiguous();
  q.scale = (groups / q.scale_scale.unsqueeze(1) * 127.0)
                .round()
                .clamp(-127, 127)
                .to(at::kChar)
                .flatten()
                .slice(0, 0, m)
                .contiguous();
  return packed;
}

at::Tensor dequantize_nf4(const Quantize& s, const at::Tensor& packed, const Quantized& q,
                          at::ScalarType dtype) {
  int64_t n = 1;
  for (auto d : q.shape) n *= d;
  return nf4::decode(packed, nf4_block_absmax(q).contiguous(), n, s.block, dtype);
}

tf_status optimizer_step_param(void* state, tf_host_context* ctx, const char* name,
                               tf_tensor param_h, tf_tensor grad_h, double lr) {
  auto* s = static_cast<Quantize*>(state);
  if (!s->adam8) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    return s->adam8->step(s->host, name, tf_sdk::borrow(param_h), tf_sdk::borrow(grad_h), lr);
  });
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Quantize>(Quantize{tf_sdk::Host(api, ctx)});
    s->quantize_weights = s->host.get_bool("weights");
    if (s->host.get_string("optimizer_state") == "int8")
      s->adam8 = std::make_unique<adamw8::State>(s->host.get_int("state_block_size"));
    if (!s->quantize_weights && !s->adam8)
      throw std::invalid_argument(
          "quantize: weights = false and optimizer_state = \"fp32\" leave nothing to quantize");
    s->format = s->host.get_string("format");
    s->block = s->host.get_int("block_size");
    s->double_quant = s->host.get_bool("double_quant");
    *out = s.release();
    return TF_OK;
  });
}

// A matrix of a decoder block (not an adapter): what quantize is about.
bool is_block_matrix(const Quantize& s, const tf_param_info& info) {
  return info.ndim == 2 && info.stage >= 0 && !(info.flags & TF_PARAM_ADAPTER) &&
         s.host.stage_info(info.stage).kind == TF_STAGE_BLOCK;
}

// The one rule for which weights this plugin stores compactly, used by the
// plan (estimate_memory, from the declarations) and the run (quantize_stage):
// the frozen dense matrices of the block stages that run.
bool stores_compactly(const Quantize& s, const tf_param_info& info) {
  return s.quantize_weights && is_block_matrix(s, info) && !info.trainable &&
         info.format == TF_FORMAT_DENSE && !s.host.stage_info(info.stage).skip;
}

// Quantizes the weights stores_compactly picks in `stage` (all stages when
// < 0) that are still on the device as made; returns how many trainable
// block matrices were seen (a QLoRA recipe with lora after quantize).
int64_t quantize_stage(Quantize* s, int32_t stage) {
  int64_t trainable_block_weights = 0;
  for (const std::string& name : s->host.param_names()) {
    const tf_param_info info = s->host.param_info(name);
    if ((stage >= 0 && info.stage != stage) || info.format != TF_FORMAT_DENSE ||
        info.residency != TF_TIER_DEVICE || info.stored_bytes == 0)
      continue;
    if (info.trainable && is_block_matrix(*s, info)) ++trainable_block_weights;
    if (!stores_compactly(*s, info)) continue;
    at::Tensor stored = s->host.param_storage(name);
    Quantized q;
    q.shape = {info.shape[0], info.shape[1]};
    q.dtype = tf_sdk::scalar_type(info.dtype);
    if (s->format == "gguf") {
      const at::Device device = stored.device();
      stored.reset();
      at::Tensor codes;
      {
        const tf_sdk::MemoryCategory weights_scope(s->host, TF_MEM_WEIGHTS);
        tf_sdk::Host::SourceBlocks b = gguf_blocks(*s, name, true);
        codes = b.bytes.to(device);
        q.ggml_type = b.type;
      }
      s->dense_bytes += info.numel * tf_sdk::element_bytes(info.dtype);
      s->compact_bytes += codes.numel();
      ++s->ggml_types[q.ggml_type];
      s->host.set_param_storage(name, codes, TF_FORMAT_GGML, TF_TIER_DEVICE);
      s->weights[name] = std::move(q);
      continue;
    }
    const at::Tensor w = std::exchange(stored, at::Tensor()).detach().to(at::kFloat);
    // Working tensors are transient; only the codes and scales are weights.
    at::Tensor codes;
    {
      const tf_sdk::MemoryCategory transient(s->host, TF_MEM_TRANSIENT);
      codes = s->format == "int8" ? quantize_int8(w, q) : quantize_nf4(*s, w, q);
    }
    {
      const tf_sdk::MemoryCategory weights_scope(s->host, TF_MEM_WEIGHTS);
      codes = codes.clone();
      for (at::Tensor* t : {&q.scale, &q.scale_scale, &q.scale_mean})
        if (t->defined()) *t = t->clone();
    }
    s->dense_bytes += w.numel() * 4;
    s->compact_bytes += codes.numel() * codes.element_size() +
                        q.scale.numel() * q.scale.element_size() +
                        (q.scale_scale.defined() ? q.scale_scale.numel() * 4 + 4 : 0);
    s->host.set_param_storage(name, codes, s->format == "int8" ? TF_FORMAT_INT8 : TF_FORMAT_NF4,
                              TF_TIER_DEVICE);
    s->weights[name] = std::move(q);
  }
  return trainable_block_weights;
}

// Streaming setup: each stage is quantized as soon as it exists.
tf_status stage_params_ready(void* state, tf_host_context* ctx, int32_t stage) {
  auto* s = static_cast<Quantize*>(state);
  if (!s->quantize_weights || stage < 0) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    quantize_stage(s, stage);
    return TF_OK;
  });
}

tf_status params_ready(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Quantize*>(state);
  if (!s->quantize_weights) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const int64_t trainable_block_weights = quantize_stage(s, -1);
    if (s->weights.empty())
      throw std::invalid_argument(
          trainable_block_weights > 0
              ? "quantize: the block weights are trainable, and quantized weights must be frozen. "
                "Put a "
                "[[strategy]] plugin = \"lora\" before quantize (QLoRA), so that only adapters "
                "train"
              : "quantize: this model has no frozen block weights to quantize");
    std::string kept;  // gguf: the file's types kept, "Q4_1 x 210"
    for (const auto& [type, n] : s->ggml_types)
      kept += (kept.empty() ? " (" : ", ") + type + " x " + std::to_string(n);
    if (!kept.empty()) kept += ")";
    s->host.log(TF_LOG_INFO, s->format + ": " + std::to_string(s->weights.size()) + " weights" +
                                 kept + ", " + std::to_string(s->dense_bytes >> 10) +
                                 " KiB dense -> " + std::to_string(s->compact_bytes >> 10) +
                                 " KiB");
    return TF_OK;
  });
}

tf_status fetch_weight(void* state, tf_host_context* ctx, const char* name, tf_tensor stored,
                       tf_tensor* out) {
  auto* s = static_cast<Quantize*>(state);
  auto it = s->weights.find(name);
  if (it == s->weights.end()) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const at::Tensor& codes = tf_sdk::borrow(stored);
    const Quantized& q = it->second;
    // Under autocast an fp32 weight goes straight to the dtype linear would
    // cast it to (the ABI lets a fetch serve the autocast dtype): NF4's one
    // rounding of the same fp32 product, so the same bits, without the fp32
    // copy and the cast's pass over it (a sixth of a 7B QLoRA step).
    const at::DeviceType device = codes.device().type();
    const at::ScalarType dtype = q.dtype == at::kFloat && at::autocast::is_autocast_enabled(device)
                                     ? at::autocast::get_autocast_dtype(device)
                                     : q.dtype;
    at::Tensor w = s->format == "gguf"
                       ? s->host.decode_blocks(q.ggml_type, codes, q.shape[1]).to(dtype)
                   : s->format == "int8" ? dequantize_int8(codes, q).to(dtype)
                                         : dequantize_nf4(*s, codes, q, dtype);
    *out = tf_sdk::give(w.view(q.shape));
    return TF_OK;
  });
}

// The scales live here, not in the store: checkpoints carry them as plugin state.
tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Quantize*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    if (s->adam8) s->adam8->save(s->host);
    for (auto& [name, q] : s->weights) {
      if (!q.scale.defined()) continue;  // gguf: the blocks hold their own scales
      s->host.save_tensor(name + ".scale", q.scale);
      if (q.scale_scale.defined()) {
        s->host.save_tensor(name + ".scale_scale", q.scale_scale);
        s->host.save_tensor(name + ".scale_mean", q.scale_mean);
      }
    }
    return TF_OK;
  });
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Quantize*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    auto fill = [&](const std::string& key, const at::Tensor& v, at::Tensor& into) {
      if (into.defined() && v.sizes() != into.sizes())
        throw std::invalid_argument("quantize: checkpoint scales of " + key +
                                    " have another shape (format or block_size changed?)");
      into = v.to(into.defined() ? into.device() : v.device());
    };
    auto get = [&](const std::string& key, at::Tensor& into) {
      fill(key, s->host.saved_tensor(key), into);
    };
    if (s->adam8) s->adam8->load(s->host);
    for (auto& [name, q] : s->weights) {
      if (!q.scale.defined()) continue;
      get(name + ".scale", q.scale);
      if (q.scale_scale.defined()) {
        get(name + ".scale_scale", q.scale_scale);
        get(name + ".scale_mean", q.scale_mean);
      }
    }
    return TF_OK;
  });
}

// `tightfit fit` may quantize frozen weights; a recipe's format is its
// choice of base (a different base is a different model to train).
const tf_plugin_search kSearch = {.struct_size = sizeof(tf_plugin_search),
                                  .flags = TF_SEARCH_PLUGIN_FROZEN_WEIGHTS,
                                  .stack_order = 10};
const tf_search_value kFormats[] = {
    tf_sdk::search_value("\"int8\"", "int8 base", "int8 weights", 0.5),
    tf_sdk::search_value("\"nf4\"", "nf4 base", "nf4 weights", 1.0),
};
const tf_key_search kFormatSearch = tf_sdk::key_search(kFormats, TF_SEARCH_KEY_RECIPES_CHOICE);

const tf_config_key kKeys[] = {
    tf_sdk::key("weights", TF_VALUE_BOOL, "true", "store frozen block weights compact"),
    tf_sdk::key(
        "optimizer_state", TF_VALUE_STRING, "\"fp32\"",
        "AdamW moments of trainable weights: fp32 (the kernel's) or int8 (block-wise, 8-bit AdamW; "
        "the same as [[strategy]] plugin = \"adamw8\", which does it without quantizing weights)",
        1, 0, "fp32|int8"),
    tf_sdk::key("state_block_size", TF_VALUE_INT, "256",
                "int8 optimizer state: values per absmax block", 2, 65536),
    tf_sdk::searched(
        tf_sdk::key("format", TF_VALUE_STRING, "\"nf4\"",
                    "storage of frozen block weights; gguf: a GGUF weights file's own blocks", 1, 0,
                    "nf4|int8|gguf"),
        kFormatSearch),
    tf_sdk::key("block_size", TF_VALUE_INT, "64", "nf4: weights per absmax block", 2, 65536),
    tf_sdk::key("double_quant", TF_VALUE_BOOL, "true", "nf4: store block absmaxes as int8 (QLoRA)"),
};

// The frozen dense block weights this recipe will store compactly (those
// quantize_stage converts), the dense copy of the largest one while a linear
// computes with it, and 8-bit AdamW state in place of fp32 moments.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Quantize*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    int64_t dense = 0, compact = 0, scales = 0, largest = 0, trainable = 0;
    for (const std::string& name : s->host.param_names()) {
      const tf_param_info info = s->host.param_info(name);
      if (info.trainable && !(info.flags & TF_PARAM_ADAPTER)) trainable += info.numel;
      if (!stores_compactly(*s, info)) continue;
      const int64_t n = info.numel, elt = tf_sdk::element_bytes(info.dtype);
      // The codes the store holds (and a tier may move), and the scales
      // this plugin keeps beside them on the device, whatever the codes' tier
      // (a GGUF file's blocks carry their own).
      int64_t codes = s->format == "int8" ? n : n / 2;
      if (s->format == "gguf") {
        const tf_sdk::Host::SourceBlocks b = gguf_blocks(*s, name, false);
        codes = b.rows * b.row_bytes;
      }
      const int64_t scale_bytes =
          s->format == "gguf" ? 0
          : s->format == "int8"
              ? 4 * info.shape[0]
              // one absmax per block (int8 with double quantization)
              : (n / s->block) * (s->double_quant ? 1 : 4) + 8 * (n / s->block / 256 + 1);
      dense += n * elt;
      compact += codes + scale_bytes;
      scales += scale_bytes;
      largest = std::max(largest, n * elt);
      if (s->host.has_param_plan())
        s->host.plan(name, codes,
                     s->format == "gguf"   ? TF_FORMAT_GGML
                     : s->format == "int8" ? TF_FORMAT_INT8
                                           : TF_FORMAT_NF4,
                     s->host.planned(name).tier);
    }
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_WEIGHTS] =
        s->host.has_param_plan() ? scales
                                 : compact - dense;  // an older host: all as a weights delta
    // One weight dequantized at a time, while its block computes (ABI 1.6);
    // an older host counts it at every moment.
    if (TF_SDK_REACHES(out, tf_memory_estimate, block_bytes))
      out->block_bytes = largest;
    else
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_TRANSIENT] = largest;
    if (s->adam8)
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OPTIMIZER] = s->adam8->optimizer_delta(trainable);
    out->time_factor = 0;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    return TF_OK;
  });
}

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Quantize>,
                                    .params_ready = params_ready,
                                    .fetch_weight = fetch_weight,
                                    .optimizer_step_param = optimizer_step_param,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state,
                                    .stage_params_ready = stage_params_ready};

const tf_plugin_descriptor kDescriptor = tf_sdk::searched(
    tf_sdk::describe(TF_PLUGIN_STRATEGY, "quantize", "1.0.0",
                     "frozen block weights as int8 (per channel), NF4 "
                     "(double-quantized) or a GGUF file's own blocks, dequantized just in time",
                     kKeys, &kVtable),
    kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
