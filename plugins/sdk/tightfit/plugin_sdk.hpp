// C++ conveniences for plugins built against the full LibTorch C++ API.
//
// The ABI itself (plugin-api/tightfit/plugin_api.h) is plain C; this header
// only turns its handles into at::Tensor and its status codes into
// exceptions and back, so plugin code can read like ordinary LibTorch code.
// Nothing here crosses the boundary: every exception is caught in `guard`.
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/plugin_api.h"

namespace tf_sdk {

// An AtenTensorHandle is an at::Tensor* under the hood (LibTorch's aoti shim
// says so and converts the same way).
inline const at::Tensor& borrow(tf_tensor handle) {
  return *reinterpret_cast<at::Tensor*>(handle);
}

// Hands a tensor across the boundary as a new handle.
inline tf_tensor give(at::Tensor t) {
  return reinterpret_cast<tf_tensor>(new at::Tensor(std::move(t)));
}

// Takes ownership of a new handle the host returned.
inline at::Tensor take(tf_tensor handle) {
  auto* p = reinterpret_cast<at::Tensor*>(handle);
  at::Tensor t = std::move(*p);
  delete p;
  return t;
}

// Lends a tensor to a host service as a borrowed handle (the host copies or
// references what it keeps; the handle is valid only for the call).
inline tf_tensor lend(const at::Tensor& t) {
  return reinterpret_cast<tf_tensor>(const_cast<at::Tensor*>(&t));
}

// A host service failed; carries the host's message.
struct HostError : std::runtime_error {
  tf_status status;
  HostError(tf_status s, const std::string& what) : std::runtime_error(what), status(s) {}
};

// The host table and context of one plugin instance, with throwing wrappers.
class Host {
 public:
  Host(const tf_host_api* api, tf_host_context* ctx) : api_(api), ctx_(ctx) {}
  const tf_host_api* api() const { return api_; }
  tf_host_context* ctx() const { return ctx_; }

  void check(tf_status s) const {
    if (s != TF_OK) throw HostError(s, api_->last_error(ctx_));
  }

  int64_t get_int(const char* key) const {
    int64_t v = 0;
    check(api_->config_get_int(ctx_, key, &v));
    return v;
  }
  double get_double(const char* key) const {
    double v = 0;
    check(api_->config_get_double(ctx_, key, &v));
    return v;
  }
  bool get_bool(const char* key) const {
    int32_t v = 0;
    check(api_->config_get_bool(ctx_, key, &v));
    return v != 0;
  }
  std::string get_string(const char* key) const {
    const char* v = nullptr;
    check(api_->config_get_string(ctx_, key, &v));
    return v ? v : "";
  }
  bool has(const char* key) const { return api_->config_has(ctx_, key) != 0; }
  // A list key's elements (STRING_LIST; INT_LIST / SIZE_LIST with get_int_list).
  std::vector<std::string> get_string_list(const char* key) const {
    std::vector<std::string> out;
    for (int32_t i = 0;; ++i) {
      const char* v = nullptr;
      const tf_status st = api_->config_get_list_string(ctx_, key, i, &v);
      if (st == TF_ERR_NOT_FOUND) return out;
      check(st);
      out.emplace_back(v ? v : "");
    }
  }
  std::vector<int64_t> get_int_list(const char* key) const {
    std::vector<int64_t> out;
    for (int32_t i = 0;; ++i) {
      int64_t v = 0;
      const tf_status st = api_->config_get_list_int(ctx_, key, i, &v);
      if (st == TF_ERR_NOT_FOUND) return out;
      check(st);
      out.push_back(v);
    }
  }

  // Collectives across ranks (identities in a single process). A host from
  // before they were added refuses with a clear message.
  void all_reduce(at::Tensor& t, tf_reduce_op op) const {
    check(need_dist(TF_HAS(api_, tf_host_api, dist_all_reduce))
              ->dist_all_reduce(ctx_, reinterpret_cast<tf_tensor>(&t), op));
  }
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, tf_reduce_op op) const {
    check(need_dist(TF_HAS(api_, tf_host_api, dist_reduce_scatter))
              ->dist_reduce_scatter(ctx_, reinterpret_cast<tf_tensor>(&out),
                                    reinterpret_cast<tf_tensor>(const_cast<at::Tensor*>(&in)), op));
  }
  void all_gather(at::Tensor& out, const at::Tensor& in) const {
    check(need_dist(TF_HAS(api_, tf_host_api, dist_all_gather))
              ->dist_all_gather(ctx_, reinterpret_cast<tf_tensor>(&out),
                                reinterpret_cast<tf_tensor>(const_cast<at::Tensor*>(&in))));
  }

  tf_run_info run_info() const {
    tf_run_info info{};
    info.struct_size = sizeof info;
    check(api_->run_info(ctx_, &info));
    return info;
  }

  at::Tensor weight(const std::string& name) const {
    tf_tensor out = nullptr;
    check(api_->weight(ctx_, name.c_str(), &out));
    return take(out);
  }

  at::Tensor linear(const at::Tensor& x, const std::string& weight,
                    const std::string& bias = {}) const {
    tf_tensor out = nullptr;
    auto* xh = reinterpret_cast<tf_tensor>(const_cast<at::Tensor*>(&x));
    check(api_->linear(ctx_, xh, weight.c_str(), bias.empty() ? nullptr : bias.c_str(), &out));
    return take(out);
  }

  // fn(x) through the host's tiled_over_tokens (ABI 1.29): in training
  // under [run] mlp_tile_tokens, a tile of tokens at a time, each run again in
  // backward; from a host that predates it, fn(x) here. `user` must live as
  // long as the model.
  at::Tensor tiled_over_tokens(const at::Tensor& x, tf_tokenwise_fn fn, void* user,
                               int64_t tag) const {
    tf_tensor out = nullptr;
    auto* xh = reinterpret_cast<tf_tensor>(const_cast<at::Tensor*>(&x));
    if (TF_HAS(api_, tf_host_api, tiled_over_tokens))
      check(api_->tiled_over_tokens(ctx_, xh, fn, user, tag, &out));
    else
      check(fn(user, ctx_, tag, xh, &out));
    return take(out);
  }

  // Model declarations (inside a model's create).
  void declare_param(const std::string& name, std::vector<int64_t> shape, tf_dtype dtype,
                     int32_t stage, tf_init_kind init, double init_std, uint32_t flags,
                     double routed_share = 0) const {
    tf_param_spec spec{};
    spec.struct_size = sizeof spec;
    spec.name = name.c_str();
    spec.ndim = static_cast<int32_t>(shape.size());
    spec.shape = shape.data();
    spec.dtype = dtype;
    spec.stage = stage;
    spec.init = init;
    spec.init_std = init_std;
    spec.flags = flags;
    spec.routed_share = routed_share;  // ABI 1.17; an older host reads no further than tied_to
    check(api_->declare_param(ctx_, &spec));
  }
  // All of a stage's per-token byte counts for `plan` (tf_stage_spec); 0 = unknown.
  struct StageMemory {
    int64_t activations = 0;
    int64_t frozen_activations = 0;
    int64_t output = 0;
    int64_t backward = 0;
    int64_t frozen_backward = 0;
    // What the model's decode cache keeps for the stage, per row (ABI 1.26):
    // bytes per token seen (keys and values), and a recurrent state's bytes.
    int64_t decode_cache = 0;
    int64_t decode_state = 0;
  };
  // Activation bytes per token (all, and with the stage's own weights frozen)
  // and output bytes per token, for `plan`; 0 = unknown.
  int32_t declare_stage(const std::string& name, tf_stage_kind kind,
                        int64_t activation_bytes_per_token, int64_t flops_per_token,
                        int64_t frozen_activation_bytes_per_token = 0,
                        int64_t output_bytes_per_token = 0) const {
    return declare_stage(name, kind,
                         StageMemory{activation_bytes_per_token, frozen_activation_bytes_per_token,
                                     output_bytes_per_token},
                         flops_per_token);
  }
  // Forward FLOPs per token, and the part of them computed through
  // tiled_over_tokens (tf_stage_spec.tiled_flops_per_token, ABI 1.30); a
  // plain count converts (nothing tiled).
  struct StageFlops {
    StageFlops(int64_t total_flops = 0, int64_t tiled_flops = 0)  // NOLINT: a count converts
        : total(total_flops), tiled(tiled_flops) {}
    int64_t total;
    int64_t tiled;
  };
  int32_t declare_stage(const std::string& name, tf_stage_kind kind, const StageMemory& bytes,
                        StageFlops flops) const {
    return declare_stage(name, kind, bytes, flops, HeadProjection{});
  }
  // A head whose output is host.linear(hidden, weight, bias) with nothing
  // after it (tf_stage_spec.projection_weight, ABI 1.5): the host may ask for
  // the hidden alone (head_hidden_only) and fuse the projection with the loss.
  // logits_bytes: the part of the activation bytes per token the logits are.
  struct HeadProjection {
    std::string weight;
    std::string bias;  // empty: none
    int64_t logits_bytes = 0;
    double softcap = 0;  // logits c tanh(z / c) (ABI 1.14); 0: none
  };
  int32_t declare_stage(const std::string& name, tf_stage_kind kind, const StageMemory& bytes,
                        StageFlops flops, const HeadProjection& projection) const {
    tf_stage_spec spec{};
    spec.struct_size = sizeof spec;
    spec.name = name.c_str();
    spec.kind = kind;
    spec.activation_bytes_per_token = bytes.activations;
    spec.flops_per_token = flops.total;
    spec.tiled_flops_per_token = flops.tiled;  // an older host reads no further
    spec.frozen_activation_bytes_per_token = bytes.frozen_activations;
    spec.output_bytes_per_token = bytes.output;
    spec.backward_bytes_per_token = bytes.backward;
    spec.frozen_backward_bytes_per_token = bytes.frozen_backward;
    spec.decode_cache_bytes_per_token = bytes.decode_cache;  // an older host reads no further
    spec.decode_state_bytes = bytes.decode_state;
    if (!projection.weight.empty()) {
      spec.projection_weight = projection.weight.c_str();
      spec.projection_bias = projection.bias.empty() ? nullptr : projection.bias.c_str();
      spec.projection_bytes_per_token = projection.logits_bytes;
      spec.projection_softcap = projection.softcap;
    }
    int32_t index = -1;
    check(api_->declare_stage(ctx_, &spec, &index));
    return index;
  }

  tf_param_info param_info(const std::string& name) const {
    tf_param_info info{};
    info.struct_size = sizeof info;
    check(api_->param_info(ctx_, name.c_str(), &info));
    return info;
  }
  std::vector<std::string> param_names() const {
    int32_t n = 0;
    check(api_->param_count(ctx_, &n));
    std::vector<std::string> names;
    for (int32_t i = 0; i < n; ++i) {
      const char* name = nullptr;
      check(api_->param_name(ctx_, i, &name));
      names.emplace_back(name);
    }
    return names;
  }

  // The planned parameter table (inside estimate_memory; hosts since the
  // 1.0 tail): what earlier strategies planned for a parameter, and a change.
  bool has_param_plan() const { return TF_HAS(api_, tf_host_api, plan_param_set); }
  tf_param_plan planned(const std::string& name) const {
    tf_param_plan p{};
    p.struct_size = sizeof p;
    check(api_->plan_param_get(ctx_, name.c_str(), &p));
    return p;
  }
  void plan(const std::string& name, int64_t bytes, tf_param_format format,
            tf_residency tier) const {
    const tf_param_plan p{sizeof(tf_param_plan), bytes, format, tier};
    check(api_->plan_param_set(ctx_, name.c_str(), &p));
  }

  // How a GGUF [model] weights file stores matrix `name` (hosts since 1.9),
  // with its bytes when asked. A HostError with TF_ERR_NOT_FOUND says why
  // there are none (the weights are not GGUF, no such matrix).
  struct SourceBlocks {
    std::string type;  // ggml's type name: "Q4_1", "Q8_0", "F16", ...
    int64_t rows = 0, cols = 0, row_bytes = 0;
    at::Tensor bytes;  // uint8 [rows, row_bytes] on CPU
  };
  bool has_source_blocks() const { return TF_HAS(api_, tf_host_api, blocks_decode); }
  SourceBlocks source_blocks(const std::string& name, bool with_bytes) const {
    if (!has_source_blocks())
      throw HostError(TF_ERR_UNSUPPORTED, "this tightfit predates GGUF block access (ABI 1.9)");
    tf_source_blocks b{};
    b.struct_size = sizeof b;
    check(api_->param_source_blocks(ctx_, name.c_str(), with_bytes ? 1 : 0, &b));
    SourceBlocks out{std::string(b.type, strnlen(b.type, sizeof b.type)), b.rows, b.cols,
                     b.row_bytes, at::Tensor()};
    if (b.bytes) out.bytes = take(b.bytes);
    return out;
  }
  // Rows of ggml blocks decoded to float32 [rows, cols] on bytes' device.
  at::Tensor decode_blocks(const std::string& type, const at::Tensor& bytes, int64_t cols) const {
    tf_tensor out = nullptr;
    check(api_->blocks_decode(ctx_, type.c_str(),
                              reinterpret_cast<tf_tensor>(const_cast<at::Tensor*>(&bytes)), cols,
                              &out));
    return take(out);
  }

  int32_t stage_count() const {
    int32_t n = 0;
    check(api_->stage_count(ctx_, &n));
    return n;
  }
  tf_stage_info stage_info(int32_t stage) const {
    tf_stage_info info{};
    info.struct_size = sizeof info;
    check(api_->stage_info(ctx_, stage, &info));
    return info;
  }

  void log(tf_log_level level, const std::string& msg) const {
    api_->log(ctx_, level, msg.c_str());
  }

  // `value` (one real number) read with the host's next read of the device
  // (the update's gradient norm) into *out, which must outlive the step
  // (ABI 1.20's read_later): a plugin's own figure without a read of its
  // own. False on an older host, which wrote nothing: read it yourself.
  bool read_later(const at::Tensor& value, double* out) const {
    if (!TF_HAS(api_, tf_host_api, read_later)) return false;
    check(api_->read_later(ctx_, lend(value), out));
    return true;
  }

  // How far a long phase of the plugin's own has come, for a person at a
  // terminal (ABI 1.22's progress): `done` of `total` `unit`s (total 0: not
  // known). It ends at done >= total > 0, at end_progress(), or when the
  // plugin call it was reported in returns. Nothing on an older host.
  void progress(const char* phase, int64_t done, int64_t total, const char* unit) const {
    if (TF_HAS(api_, tf_host_api, progress)) check(api_->progress(ctx_, phase, done, total, unit));
  }
  void end_progress() const {
    if (TF_HAS(api_, tf_host_api, progress)) check(api_->progress(ctx_, nullptr, 0, 0, nullptr));
  }

  // The strategies' adapters (LoRA) off or on for the passes that follow
  // (ABI 1.10); how many strategies hold adapters (0: none, nothing changed).
  int32_t set_adapters_enabled(bool on) const {
    if (!TF_HAS(api_, tf_host_api, adapters_set_enabled))
      throw std::runtime_error(
          "this tightfit cannot switch adapters off (plugin ABI 1.10): update it");
    int32_t holders = 0;
    check(api_->adapters_set_enabled(ctx_, on ? 1 : 0, &holders));
    return holders;
  }
  // Adds `term` (a float scalar) to the loss of the pass whose stage is
  // running, reported and back-propagated with it (ABI 1.16; a model's own
  // term, such as a mixture of experts' load-balancing loss).
  void add_loss_term(const at::Tensor& term) const {
    if (!TF_HAS(api_, tf_host_api, add_loss_term))
      throw std::runtime_error(
          "this tightfit cannot add a model's term to the loss (plugin ABI 1.16): update it");
    check(api_->add_loss_term(ctx_, lend(term)));
  }
  // The weights the model fetches next in its running stage, in order (ABI
  // 1.17; a mixture of experts once routed): a strategy keeping them in
  // another tier may start reading them. A hint: an older host ignores it.
  void expect_weights(const std::vector<std::string>& names) const {
    if (!TF_HAS(api_, tf_host_api, expect_weights) || names.empty()) return;
    std::vector<const char*> list;
    list.reserve(names.size());
    for (const std::string& n : names) list.push_back(n.c_str());
    check(api_->expect_weights(ctx_, list.data(), static_cast<int32_t>(list.size())));
  }
  // Lets the next sequence_logps or token_logps call take the model's own
  // loss terms (ABI 1.18; a mixture of experts' load-balancing loss), which
  // those passes refuse otherwise: their sum lands in *sum when that call
  // returns, and its backward also back-propagates grad_weight times it.
  // False on an older host, whose passes refuse the terms as before.
  bool take_loss_terms(double grad_weight, double* sum) const {
    if (!TF_HAS(api_, tf_host_api, take_loss_terms)) return false;
    check(api_->take_loss_terms(ctx_, grad_weight, sum));
    return true;
  }
  // ABI 1.19: the next sequence_logps or token_logps call also measures
  // each position's logits averaged over the vocabulary into *out (fp32
  // [B, T] on the CPU, every position's; take() it after the call). False
  // on an older host, which leaves *out unwritten.
  bool take_mean_logits(tf_tensor* out) const {
    if (!TF_HAS(api_, tf_host_api, take_mean_logits)) return false;
    check(api_->take_mean_logits(ctx_, out));
    return true;
  }
  // ABI 1.19: frozen copies `prefix` + name of the trainable parameters,
  // which the strategies place as any frozen weight (a schedule's create
  // only); how many. -1 on an older host, which has no copies.
  int32_t declare_param_copies(const std::string& prefix) const {
    if (!TF_HAS(api_, tf_host_api, declare_param_copies)) return -1;
    int32_t n = 0;
    check(api_->declare_param_copies(ctx_, prefix.c_str(), &n));
    return n;
  }
  // ABI 1.24: the same copies, kept by the host dense in `tier`
  // (TF_TIER_DEVICE, or TF_TIER_HOST: host memory) and holding the weights
  // as training finds them; no strategy places them. How many; -1 on an
  // older host.
  int32_t declare_kept_param_copies(const std::string& prefix, tf_residency tier) const {
    if (!TF_HAS(api_, tf_host_api, declare_kept_param_copies)) return -1;
    int32_t n = 0;
    check(api_->declare_kept_param_copies(ctx_, prefix.c_str(), tier, &n));
    return n;
  }
  // The passes read the copies under `prefix` ("" : the parameters).
  void use_param_copies(const std::string& prefix) const {
    if (!TF_HAS(api_, tf_host_api, use_param_copies))
      throw std::runtime_error("this tightfit has no use_param_copies (ABI 1.19)");
    check(api_->use_param_copies(ctx_, prefix.c_str()));
  }
  // A metric on this step's line; best effort (a metric never stops a step).
  void log_metric(const std::string& key, double value) const {
    api_->log_metric(ctx_, key.c_str(), value);
  }
  // Clears every trainable parameter's gradient (a schedule, before a step).
  void zero_grad() const { check(api_->zero_grad(ctx_)); }
  // The run's optimizer settings and the step being taken.
  tf_optimizer_info optimizer_info() const {
    tf_optimizer_info o{};
    o.struct_size = sizeof o;
    check(api_->optimizer_info(ctx_, &o));
    return o;
  }

  // The stored tensor of a parameter, in its current format and residency.
  at::Tensor param_storage(const std::string& name) const {
    tf_tensor out = nullptr;
    check(api_->param_storage(ctx_, name.c_str(), &out));
    return take(out);
  }
  // Replaces it (the store keeps its own reference) and records its format
  // and residency; a non-dense format is served by this plugin's fetch_weight.
  void set_param_storage(const std::string& name, const at::Tensor& value, tf_param_format format,
                         tf_residency residency) const {
    check(api_->param_set_storage(ctx_, name.c_str(), lend(value), format, residency));
  }

  void set_param_trainable(const std::string& name, bool trainable) const {
    check(api_->param_set_trainable(ctx_, name.c_str(), trainable ? 1 : 0));
  }
  // The parameter += alpha * delta, in place (delta: any device).
  void add_to_param(const std::string& name, const at::Tensor& delta, double alpha) const {
    check(api_->param_add_(ctx_, name.c_str(), lend(delta), alpha));
  }

  // The stages' settings strategies change while the run is composed.
  void set_stage_recompute(int32_t stage, bool on) const {
    check(api_->stage_set_recompute(ctx_, stage, on ? 1 : 0));
  }
  void set_stage_device(int32_t stage, const std::string& device) const {
    check(api_->stage_set_device(ctx_, stage, device.c_str()));
  }
  void set_stage_skip(int32_t stage, bool skip) const {
    check(api_->stage_set_skip(ctx_, stage, skip ? 1 : 0));
  }

  // In-memory snapshots of the weights (and the optimizer's state), and
  // seeded perturbations of every trainable weight (MeZO).
  int32_t take_snapshot(bool with_optimizer) const {
    int32_t id = -1;
    check(api_->snapshot_take(ctx_, with_optimizer ? 1 : 0, &id));
    return id;
  }
  void restore_snapshot(int32_t id) const { check(api_->snapshot_restore(ctx_, id)); }
  void drop_snapshot(int32_t id) const { check(api_->snapshot_drop(ctx_, id)); }
  void perturb_params(uint64_t seed, double scale) const {
    check(api_->perturb_params(ctx_, seed, scale));
  }

  // The run's optimizer on one parameter, now, with grad_scale * grad.
  void optimizer_apply(const std::string& name, const at::Tensor& grad, double grad_scale) const {
    check(api_->optimizer_apply(ctx_, name.c_str(), lend(grad), grad_scale));
  }
  // The run's optimizer on `param` (updated in place; a copy of the
  // parameter will do) with state the caller keeps (optimizer_info().n_state
  // fp32 tensors shaped like it, zero before the first update).
  void optimizer_update(const std::string& name, const at::Tensor& param, const at::Tensor& grad,
                        const std::vector<at::Tensor>& state) const {
    std::vector<tf_tensor> handles;
    handles.reserve(state.size());
    for (const at::Tensor& t : state) handles.push_back(lend(t));
    check(api_->optimizer_update(ctx_, name.c_str(), lend(param), lend(grad),
                                 static_cast<int32_t>(handles.size()), handles.data()));
  }

  // Gradient accumulation: the passes that follow are micro-batch `index`
  // of `count`; and where the current backward is (0 of 1 on a host
  // without the service).
  void set_micro_batch(int32_t index, int32_t count) const {
    check(api_->set_micro_batch(ctx_, index, count));
  }
  std::pair<int32_t, int32_t> micro_batch() const {
    int32_t index = 0, count = 1;
    if (TF_HAS(api_, tf_host_api, micro_batch)) check(api_->micro_batch(ctx_, &index, &count));
    return {index, count};
  }

  // A plugin's own tensor files (adapters): written atomically; read back a
  // tensor at a time (nothing when the file lacks it). The host keeps the
  // last file read open for this plugin until release_tensor_file().
  void save_tensors(const std::string& path, const std::vector<std::string>& names,
                    const std::vector<at::Tensor>& tensors, const char* metadata_json) const {
    std::vector<const char*> name_ptrs;
    std::vector<tf_tensor> handles;
    for (size_t i = 0; i < names.size(); ++i) {
      name_ptrs.push_back(names[i].c_str());
      handles.push_back(lend(tensors[i]));
    }
    check(api_->tensors_save(ctx_, path.c_str(), static_cast<int32_t>(names.size()),
                             name_ptrs.data(), handles.data(), metadata_json));
  }
  std::optional<at::Tensor> load_tensor(const std::string& path, const std::string& name) const {
    tf_tensor out = nullptr;
    const tf_status st = api_->tensors_load(ctx_, path.c_str(), name.c_str(), &out);
    if (st == TF_ERR_NOT_FOUND) return std::nullopt;
    check(st);
    return take(out);
  }
  void release_tensor_file() const { api_->tensors_load(ctx_, nullptr, nullptr, nullptr); }

  // Plugin state in checkpoints (inside save_state / load_state). A tensor
  // put is written to the checkpoint's file before the call returns.
  void save_tensor(const std::string& key, const at::Tensor& value) const {
    check(api_->state_put_tensor(ctx_, key.c_str(), lend(value)));
  }
  void save_double(const std::string& key, double value) const {
    check(api_->state_put_double(ctx_, key.c_str(), value));
  }
  // The saved value; throws HostError (TF_ERR_NOT_FOUND, the host's message)
  // when the checkpoint has no `key`.
  at::Tensor saved_tensor(const std::string& key) const {
    tf_tensor out = nullptr;
    check(api_->state_get_tensor(ctx_, key.c_str(), &out));
    return take(out);
  }
  double saved_double(const std::string& key) const {
    double v = 0;
    check(api_->state_get_double(ctx_, key.c_str(), &v));
    return v;
  }
  // The saved value, or nothing when the checkpoint has no `key` (state a
  // plugin may not have had yet); any other failure throws.
  std::optional<at::Tensor> find_saved_tensor(const std::string& key) const {
    tf_tensor out = nullptr;
    const tf_status st = api_->state_get_tensor(ctx_, key.c_str(), &out);
    if (st == TF_ERR_NOT_FOUND) return std::nullopt;
    check(st);
    return take(out);
  }
  std::optional<double> find_saved_double(const std::string& key) const {
    double v = 0;
    const tf_status st = api_->state_get_double(ctx_, key.c_str(), &v);
    if (st == TF_ERR_NOT_FOUND) return std::nullopt;
    check(st);
    return v;
  }

 private:
  const tf_host_api* need_dist(bool present) const {
    if (!present)
      throw HostError(TF_ERR_UNSUPPORTED,
                      "this tightfit host has no collectives (dist_* services); update it");
    return api_;
  }
  const tf_host_api* api_;
  tf_host_context* ctx_;
};

// Attributes the allocations this thread makes to `category` while it lives
// (a strategy's own buffers, working copies).
class MemoryCategory {
 public:
  MemoryCategory(const Host& host, tf_mem_category category) : host_(host) {
    host_.check(host_.api()->memory_push_category(host_.ctx(), category));
  }
  ~MemoryCategory() { host_.api()->memory_pop_category(host_.ctx()); }
  MemoryCategory(const MemoryCategory&) = delete;
  MemoryCategory& operator=(const MemoryCategory&) = delete;

 private:
  Host host_;
};

// The next batch of the run (next_batch), released when it goes out of
// scope, with the host's passes over it.
// What sequence_logps gives: each row's summed target log-probability
// (fp32 [rows]) and how many targets it has (int64 [rows]), on the CPU.
struct SequenceLogps {
  at::Tensor logps, counts;
};

// Which weights a pass reads (ABI 1.20's tf_pass), for that pass alone:
// the strategies' adapters off (the base model, as PEFT's
// disable_adapter()), or the frozen copies declared under a prefix
// (Host::declare_param_copies); the default reads the parameters.
struct PassWeights {
  bool adapters_off = false;
  std::string param_copies;
  bool plain() const { return !adapters_off && param_copies.empty(); }
  void apply(tf_pass& pass) const {
    pass.adapters_off = adapters_off ? 1 : 0;
    pass.param_copies = param_copies.empty() ? nullptr : param_copies.c_str();
  }
};

class Batch {
 public:
  // The next training batch.
  explicit Batch(const Host& host) : host_(host) {
    batch_.struct_size = sizeof batch_;
    host_.check(host_.api()->next_batch(host_.ctx(), &batch_));
    owned_ = true;
  }
  // The run's preference rows with row_ids [first, first + count) (ABI
  // 1.13), at most up to the end of their split; pairs() 0 past the last.
  Batch(const Host& host, int64_t first, int64_t count) : host_(host) {
    if (!TF_HAS(host_.api(), tf_host_api, preference_rows))
      throw std::runtime_error("this tightfit has no preference_rows (plugin ABI 1.13): update it");
    batch_.struct_size = sizeof batch_;
    host_.check(host_.api()->preference_rows(host_.ctx(), first, count, &batch_));
    owned_ = true;
  }
  // A batch the plugin made itself (online RL's prompt + completion rows):
  // int64 [B, T] tokens and targets (ignore_index -100 where nothing is
  // scored) and the attention mask (1 on each row's tokens, 0 on the
  // padding after them), kept for the batch's life.
  Batch(const Host& host, at::Tensor tokens, at::Tensor targets, at::Tensor attention_mask)
      : host_(host),
        own_tokens_(std::move(tokens)),
        own_targets_(std::move(targets)),
        own_mask_(std::move(attention_mask)) {
    batch_.struct_size = sizeof batch_;
    batch_.tokens = lend(own_tokens_);
    batch_.targets = lend(own_targets_);
    batch_.attention_mask = own_mask_.defined() ? lend(own_mask_) : nullptr;
    batch_.n_tokens = own_tokens_.numel();
    batch_.n_targets = own_targets_.ne(-100).sum().item<int64_t>();
  }
  // A batch the host lends for one call (a schedule's eval_batch).
  Batch(const Host& host, const tf_batch* lent) : host_(host) {
    std::memcpy(&batch_, lent, std::min<size_t>(lent->struct_size, sizeof batch_));
    batch_.struct_size = std::min<uint32_t>(lent->struct_size, sizeof batch_);
  }
  ~Batch() {
    if (owned_) host_.api()->batch_release(host_.ctx(), &batch_);
  }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // The targets that count in this batch's loss (not ignore_index), or -1
  // from a host before ABI 1.7, which does not say.
  int64_t n_targets() const;
  // Preference pairs: rows [0, pairs) chosen, [pairs, 2 pairs) rejected (0: none).
  int64_t pairs() const;
  // A batch of prompts alone (ABI 1.25, online RL): how many rows; 0 otherwise.
  int64_t prompts() const;
  // int64 [B, T]: 1 on each row's tokens, 0 on padding; undefined when none pads.
  at::Tensor attention_mask() const;
  int64_t n_tokens() const { return batch_.n_tokens; }

  // Each row's summed target log-probability (ABI 1.10), without gradients
  // when `grad_weights` is undefined, else also the backward of
  // sum_r grad_weights[r] * logps[r] into the parameters' gradients; read
  // with `weights` (one run_pass, ABI 1.20, where the host has it).
  SequenceLogps sequence_logps(const at::Tensor& grad_weights = {},
                               const PassWeights& weights = {}) const {
    if (TF_HAS(host_.api(), tf_host_api, run_pass)) {
      tf_pass pass = new_pass(TF_PASS_SEQUENCE_LOGPS);
      if (grad_weights.defined()) {
        pass.backward = 1;
        pass.grad_weights = lend(grad_weights);
      }
      weights.apply(pass);
      PassResult r = run(pass);
      return {std::move(r.logps), std::move(r.counts)};
    }
    if (!TF_HAS(host_.api(), tf_host_api, sequence_logps))
      throw std::runtime_error("this tightfit has no sequence_logps (plugin ABI 1.10): update it");
    need_plain(weights);
    tf_tensor logps = nullptr, counts = nullptr;
    host_.check(host_.api()->sequence_logps(host_.ctx(), &batch_,
                                            grad_weights.defined() ? lend(grad_weights) : nullptr,
                                            &logps, &counts));
    return {take(logps), take(counts)};
  }

  // Each target's log-probability (ABI 1.12): fp32 [B, T] on the CPU, 0
  // where the target is ignored. `targets` (int64 [B, T]), when given, is
  // scored in place of the batch's (ORPO's NLL scores the prompt's tokens
  // too); with `grad_weights` (fp32 [B, T]) also the backward of
  // sum grad_weights * logps into the parameters' gradients; read with
  // `weights` (one run_pass, ABI 1.20, where the host has it).
  at::Tensor token_logps(const at::Tensor& targets = {}, const at::Tensor& grad_weights = {},
                         const PassWeights& weights = {}) const {
    if (TF_HAS(host_.api(), tf_host_api, run_pass)) {
      tf_pass pass = new_pass(TF_PASS_TOKEN_LOGPS);
      if (targets.defined()) pass.targets = lend(targets);
      if (grad_weights.defined()) {
        pass.backward = 1;
        pass.grad_weights = lend(grad_weights);
      }
      weights.apply(pass);
      return run(pass).logps;
    }
    if (!TF_HAS(host_.api(), tf_host_api, token_logps))
      throw std::runtime_error("this tightfit has no token_logps (plugin ABI 1.12): update it");
    need_plain(weights);
    tf_batch scored = batch_;
    if (targets.defined()) scored.targets = lend(targets);
    tf_tensor logps = nullptr;
    host_.check(host_.api()->token_logps(
        host_.ctx(), &scored, grad_weights.defined() ? lend(grad_weights) : nullptr, &logps));
    return take(logps);
  }
  // The batch's input tokens and targets (int64 [B, T], ignore_index -100
  // where nothing is scored), borrowed for the batch's life.
  const at::Tensor& tokens() const { return borrow(batch_.tokens); }
  const at::Tensor& targets() const { return borrow(batch_.targets); }
  // Unpaired preference rows (ABI 1.13, KTO): int64 [pairs], 1 where the
  // completion of row r is desirable; rows [pairs, 2 pairs) are the KL rows.
  // Undefined for any other batch.
  at::Tensor desirable() const;
  // Preference batches (ABI 1.13): int64 [pairs], each pair's index among
  // the run's preference rows (training rows as stored, then held-out ones).
  at::Tensor row_ids() const;
  // Preference batches (ABI 1.21): int64 [B], 1 where the row's first token
  // is its answer's (no prompt token before it). Undefined from an older
  // host or for any other batch.
  at::Tensor answer_first() const;

  // The loss at the current weights, no gradients.
  tf_pass_result forward() const {
    tf_pass_result pass = empty_pass();
    host_.check(host_.api()->forward(host_.ctx(), &batch_, &pass));
    return pass;
  }
  // The loss, and its gradients (times loss_scale) added to the parameters'.
  tf_pass_result forward_backward(double loss_scale) const {
    tf_pass_result pass = empty_pass();
    host_.check(host_.api()->forward_backward(host_.ctx(), &batch_, loss_scale, &pass));
    return pass;
  }
  // forward_backward with the loss read later, together with the update's
  // gradient norm (ABI 1.20's defer_read), so that a step waits for the
  // device once: *out's loss and finite are written when optimizer_step
  // reads, so *out must live until then (out->read_pending is 1 until it
  // is written). A host before 1.20 reads the loss at once.
  void forward_backward_deferred(double loss_scale, tf_pass_result* out) const {
    *out = empty_pass();
    if (!TF_HAS(host_.api(), tf_host_api, run_pass)) {
      *out = forward_backward(loss_scale);
      return;
    }
    tf_pass pass = new_pass(TF_PASS_LOSS);
    pass.backward = 1;
    pass.loss_scale = loss_scale;
    pass.defer_read = 1;
    host_.check(host_.api()->run_pass(host_.ctx(), &pass, out));
  }
  // One pass over this batch as `pass` says (run_pass, ABI 1.20; its batch
  // is set here). Log-probs come back owned; the result's handles are taken.
  struct PassResult {
    tf_pass_result raw{};
    at::Tensor logps, counts, mean_logits;
    at::Tensor entropies;  // ABI 1.25 (tf_pass.entropies)
  };
  PassResult run(tf_pass pass) const {
    if (!TF_HAS(host_.api(), tf_host_api, run_pass))
      throw std::runtime_error("this tightfit has no run_pass (plugin ABI 1.20): update it");
    pass.batch = &batch_;
    PassResult r;
    r.raw = empty_pass();
    host_.check(host_.api()->run_pass(host_.ctx(), &pass, &r.raw));
    if (r.raw.logps) r.logps = take(std::exchange(r.raw.logps, nullptr));
    if (r.raw.counts) r.counts = take(std::exchange(r.raw.counts, nullptr));
    if (r.raw.mean_logits) r.mean_logits = take(std::exchange(r.raw.mean_logits, nullptr));
    if (r.raw.struct_size >= offsetof(tf_pass_result, entropies) + sizeof(tf_tensor) &&
        r.raw.entropies)
      r.entropies = take(std::exchange(r.raw.entropies, nullptr));
    return r;
  }
  // Before run_pass a pass reads the parameters, or what the modal
  // services (Host::set_adapters_enabled, use_param_copies) set.
  static void need_plain(const PassWeights& weights) {
    if (!weights.plain())
      throw std::runtime_error(
          "this tightfit has no run_pass (plugin ABI 1.20) to read a pass's own weights: update "
          "it");
  }
  // A tf_pass of this batch computing `what`, every option at its default.
  tf_pass new_pass(tf_pass_compute what) const {
    tf_pass pass{};
    pass.struct_size = sizeof pass;
    pass.compute = what;
    pass.batch = &batch_;
    return pass;
  }

 private:
  static tf_pass_result empty_pass() {
    tf_pass_result pass{};
    pass.struct_size = sizeof pass;
    return pass;
  }
  Host host_;
  at::Tensor own_tokens_, own_targets_, own_mask_;  // a batch the plugin made
  tf_batch batch_{};
  bool owned_ = false;
};

// Runs plugin code, turning any exception into a status plus set_error.
template <class F>
tf_status guard(const tf_host_api* api, tf_host_context* ctx, F&& body) noexcept {
  try {
    return body();
  } catch (const HostError& e) {
    api->set_error(ctx, e.what());
    return e.status;
  } catch (const c10::OutOfMemoryError& e) {
    api->set_error(ctx, e.what_without_backtrace());
    return TF_ERR_OUT_OF_MEMORY;
  } catch (const c10::Error& e) {
    api->set_error(ctx, e.what_without_backtrace());
    return TF_ERROR;
  } catch (const std::invalid_argument& e) {  // a configuration the plugin cannot accept
    api->set_error(ctx, e.what());
    return TF_ERR_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    api->set_error(ctx, e.what());
    return TF_ERROR;
  } catch (...) {
    api->set_error(ctx, "unknown C++ exception in plugin");
    return TF_ERROR;
  }
}

// "fp32" | "bf16" | "fp16" as a recipe writes them.
// Whether the run is only planned (`plan`, `fit`, `run --dry-run`): then
// the device may not exist here and nothing may be allocated on it. A host
// older than the field leaves it zero (the SDK zero-fills the struct).
inline bool planning_only(const tf_run_info& info) {
  return info.dry_run != 0;
}

// Whether a size-prefixed struct is long enough to hold `member`, a field a
// later minor of the ABI appended (TF_HAS is for function pointers, which
// must also be set).
#define TF_SDK_REACHES(ptr, type, member) \
  ((ptr)->struct_size >= offsetof(type, member) + sizeof((ptr)->member))

// Whether the host asks a head that declared a projection for its hidden
// state instead of its logits (tf_stage_call.hidden_only, ABI 1.5).
inline bool head_hidden_only(const tf_stage_call* call) {
  return TF_SDK_REACHES(call, tf_stage_call, hidden_only) && call->hidden_only != 0;
}

// The host writes no further than both structs reach and says how far.
inline int64_t Batch::n_targets() const {
  return TF_SDK_REACHES(&batch_, tf_batch, n_targets) ? batch_.n_targets : -1;
}
inline int64_t Batch::pairs() const {
  return TF_SDK_REACHES(&batch_, tf_batch, pairs) ? batch_.pairs : 0;
}
inline int64_t Batch::prompts() const {
  return TF_SDK_REACHES(&batch_, tf_batch, prompts) ? batch_.prompts : 0;
}
inline at::Tensor Batch::attention_mask() const {
  if (!TF_SDK_REACHES(&batch_, tf_batch, attention_mask) || batch_.attention_mask == nullptr)
    return {};
  return borrow(batch_.attention_mask);
}
inline at::Tensor Batch::desirable() const {
  if (!TF_SDK_REACHES(&batch_, tf_batch, desirable) || batch_.desirable == nullptr) return {};
  return borrow(batch_.desirable);
}
inline at::Tensor Batch::row_ids() const {
  if (!TF_SDK_REACHES(&batch_, tf_batch, row_ids) || batch_.row_ids == nullptr) return {};
  return borrow(batch_.row_ids);
}
inline at::Tensor Batch::answer_first() const {
  if (!TF_SDK_REACHES(&batch_, tf_batch, answer_first) || batch_.answer_first == nullptr) return {};
  return borrow(batch_.answer_first);
}

inline tf_dtype parse_dtype(const std::string& d) {
  if (d == "bf16") return TF_DTYPE_BF16;
  if (d == "fp16") return TF_DTYPE_F16;
  if (d == "fp32") return TF_DTYPE_F32;
  throw std::invalid_argument("unknown dtype \"" + d + "\" (fp32, bf16, fp16)");
}
inline at::ScalarType scalar_type(tf_dtype d) {
  return d == TF_DTYPE_BF16 ? at::kBFloat16 : d == TF_DTYPE_F16 ? at::kHalf : at::kFloat;
}

// Bytes per value of a parameter dtype, and a parameter's bytes in its
// declared dense form (what it takes before any strategy converts it).
inline int64_t element_bytes(tf_dtype d) {
  return d == TF_DTYPE_F32 ? 4 : 2;
}
inline int64_t dense_bytes(const tf_param_info& info) {
  return info.numel * element_bytes(info.dtype);
}

// A checkpointing strategy's step time for `plan`: the stages marked for
// recomputation run their forward FLOPs once more, against a step's ~3x
// forward. 0 (unknown) when the model declares no FLOPs.
inline double recompute_time_factor(const Host& host) {
  int64_t recompute = 0, total = 0;
  for (int32_t i = 0, n = host.stage_count(); i < n; ++i) {
    const tf_stage_info info = host.stage_info(i);
    if (info.skip) continue;
    total += info.flops_per_token;
    if (info.recompute) recompute += info.flops_per_token;
  }
  return total > 0 ? 1.0 + static_cast<double>(recompute) / (3.0 * static_cast<double>(total)) : 0;
}

inline tf_config_key key(const char* name, tf_value_type type, const char* default_value,
                         const char* doc, double min_value = 1, double max_value = 0,
                         const char* choices = nullptr) {
  return tf_config_key{sizeof(tf_config_key),
                       name,
                       type,
                       default_value,
                       doc,
                       min_value,
                       max_value,
                       choices,
                       nullptr};
}

// What `tightfit fit` may search (ABI 1.23; an older host ignores it). The
// arrays and structs must be static: the host reads them while the library
// is loaded.
constexpr tf_search_value search_value(const char* value, const char* label,
                                       const char* approximation = nullptr, double penalty = 0,
                                       uint32_t flags = 0, const char* claims = nullptr,
                                       const char* needs = nullptr) {
  return tf_search_value{
      sizeof(tf_search_value), value, label, approximation, penalty, flags, claims, needs};
}
template <size_t N>
constexpr tf_key_search key_search(const tf_search_value (&values)[N], uint32_t flags = 0,
                                   const char* with = nullptr) {
  return tf_key_search{sizeof(tf_key_search), flags, values, static_cast<uint32_t>(N), with};
}
// A key fit searches as `search` says.
inline tf_config_key searched(tf_config_key key, const tf_key_search& search) {
  key.search = &search;
  return key;
}
// A descriptor fit may add to a recipe or leave out as `search` says.
inline tf_plugin_descriptor searched(tf_plugin_descriptor d, const tf_plugin_search& search) {
  d.search = &search;
  return d;
}

// A vtable's destroy for a plugin whose state is a `new T` (its destructor
// releases what the plugin holds).
template <class T>
void destroy_state(void* state) {
  delete static_cast<T*>(state);
}

// A plugin's descriptor for this ABI and the LibTorch it is built against.
inline tf_plugin_descriptor describe(tf_plugin_kind kind, const char* name, const char* version,
                                     const char* description, const tf_config_key* keys,
                                     size_t n_keys, const void* vtable) {
  tf_plugin_descriptor d{};
  d.struct_size = sizeof d;
  d.abi_version = TF_ABI_VERSION;
  d.kind = kind;
  d.name = name;
  d.version = version;
  d.description = description;
  d.libtorch_version = TORCH_VERSION;
  d.config_keys = keys;
  d.n_config_keys = static_cast<uint32_t>(n_keys);
  d.vtable = vtable;
  return d;
}
template <size_t N>
tf_plugin_descriptor describe(tf_plugin_kind kind, const char* name, const char* version,
                              const char* description, const tf_config_key (&keys)[N],
                              const void* vtable) {
  return describe(kind, name, version, description, keys, N, vtable);
}
inline tf_plugin_descriptor describe(tf_plugin_kind kind, const char* name, const char* version,
                                     const char* description,
                                     const std::vector<tf_config_key>& keys, const void* vtable) {
  return describe(kind, name, version, description, keys.data(), keys.size(), vtable);
}

}  // namespace tf_sdk

// Defines the entry symbol returning `descriptor` (a static tf_plugin_descriptor).
#define TF_DEFINE_PLUGIN_ENTRY(descriptor)                                                        \
  extern "C" TF_PLUGIN_EXPORT tf_status tightfit_plugin_entry(const tf_host_offer* host,          \
                                                              const tf_plugin_descriptor** out) { \
    if (host == nullptr || out == nullptr) return TF_ERR_INVALID_ARGUMENT;                        \
    if (TF_VERSION_MAJOR(host->abi_version) != TF_ABI_VERSION_MAJOR) return TF_ERR_ABI;           \
    *out = &(descriptor);                                                                         \
    return TF_OK;                                                                                 \
  }
