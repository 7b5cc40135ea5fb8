// The host services table (tf_host_api) handed to every plugin. Each service
// catches every exception and turns it into a status plus last_error, so no
// C++ exception crosses the ABI.
#include <c10/util/Exception.h>

#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "checked_size.hpp"
#include "device_spec.hpp"
#include "json_input.hpp"
#include "safetensors.hpp"
#include "session.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
namespace {

// The status (and last_error) for an exception a host service threw; a
// budget refusal is also recorded as such for check_plugin_status.
tf_status status_for(tf_host_context* ctx, const std::exception& e) noexcept {
  try {
    if (auto refusal = budget_refusal(e)) {
      ctx->last_error = ctx->budget_refusal = *refusal;
      return TF_ERR_OUT_OF_MEMORY;
    }
    if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
      ctx->last_error = c->what_without_backtrace();
      return TF_ERROR;
    }
    ctx->last_error = e.what();
    if (dynamic_cast<const std::out_of_range*>(&e)) return TF_ERR_NOT_FOUND;
    if (dynamic_cast<const std::invalid_argument*>(&e)) return TF_ERR_INVALID_ARGUMENT;
  } catch (...) {  // no memory left for the message
  }
  return TF_ERROR;
}

template <class F>
tf_status serve(tf_host_context* ctx, F&& body) noexcept {
  if (ctx == nullptr) return TF_ERR_INVALID_ARGUMENT;
  try {
    body();
    return TF_OK;
  } catch (const std::exception& e) {
    return status_for(ctx, e);
  } catch (...) {
    ctx->last_error = "unknown error in host service";
    return TF_ERROR;
  }
}

template <class T>
void require(T* p, const char* what) {
  if (p == nullptr) throw std::invalid_argument(std::string(what) + " must not be NULL");
}

template <class T>
void check_size(const T* s, const char* what) {
  require(s, what);
  if (s->struct_size < sizeof(uint32_t) * 2)
    throw std::invalid_argument(std::string(what) + ".struct_size is too small");
}

// Copies a caller's struct into a zeroed one of ours, honouring its struct_size.
template <class T>
T read_struct(const T* s) {
  T out{};
  std::memcpy(&out, s, std::min<size_t>(s->struct_size, sizeof(T)));
  return out;
}

// Writes ours into the caller's struct, no further than its struct_size.
template <class T>
void write_struct(T* dst, T src) {
  const uint32_t n = dst->struct_size;
  src.struct_size = n;
  std::memcpy(dst, &src, std::min<size_t>(n, sizeof(T)));
}

void h_set_error(tf_host_context* ctx, const char* message) {
  if (ctx) ctx->plugin_error = message ? message : "(no message)";
}
const char* h_last_error(tf_host_context* ctx) {
  return ctx ? ctx->last_error.c_str() : "";
}
void h_log(tf_host_context* ctx, tf_log_level level, const char* message) {
  if (ctx && ctx->session)
    ctx->session->log(level, "[" + ctx->plugin_name + "] " + (message ? message : ""));
}

tf_status h_config_get_bool(tf_host_context* ctx, const char* key, int32_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = ctx->config.get_bool(key) ? 1 : 0;
  });
}
tf_status h_config_get_int(tf_host_context* ctx, const char* key, int64_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    for (const auto& k : ctx->config.keys())
      if (k.name == key && k.type == TF_VALUE_SIZE) {
        *out = ctx->config.get_size(key);
        return;
      }
    *out = ctx->config.get_int(key);
  });
}
tf_status h_config_get_double(tf_host_context* ctx, const char* key, double* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = ctx->config.get_double(key);
  });
}
// Strings handed to plugins stay valid for the life of the process.
const char* intern(const std::string& s) {
  static std::mutex m;
  static auto* pool = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(m);
  return pool->insert(s).first->c_str();
}

tf_status h_config_get_string(tf_host_context* ctx, const char* key, const char** out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = intern(ctx->config.get_string(key));
  });
}
tf_status h_config_get_list_string(tf_host_context* ctx, const char* key, int32_t index,
                                   const char** out) {
  return serve(ctx, [&] {
    require(out, "out");
    const auto list = ctx->config.get_string_list(key);
    if (index < 0 || static_cast<size_t>(index) >= list.size())
      throw std::out_of_range(std::string("index past the end of ") + key);
    *out = intern(list[static_cast<size_t>(index)]);
  });
}
tf_status h_config_get_list_int(tf_host_context* ctx, const char* key, int32_t index,
                                int64_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    const auto list = ctx->config.get_int_list(key);
    if (index < 0 || static_cast<size_t>(index) >= list.size())
      throw std::out_of_range(std::string("index past the end of ") + key);
    *out = list[static_cast<size_t>(index)];
  });
}
int32_t h_config_has(tf_host_context* ctx, const char* key) {
  return ctx && key && ctx->config.has(key) ? 1 : 0;
}

tf_status h_run_info(tf_host_context* ctx, tf_run_info* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_run_info");
    write_struct(out, ctx->session->run_info());
  });
}

void h_tensor_release(tf_tensor t) {
  delete reinterpret_cast<at::Tensor*>(t);
}

tf_status h_declare_param(tf_host_context* ctx, const tf_param_spec* spec) {
  return serve(ctx, [&] {
    require(spec, "spec");
    if (!ctx->session->declaring())
      throw std::logic_error(
          "declare_param is only allowed in a model's create or a strategy's configure");
    if (spec->struct_size < offsetof(tf_param_spec, tied_to))
      throw std::invalid_argument("tf_param_spec.struct_size too small");
    ctx->session->store().declare(read_struct(spec));
  });
}

tf_status h_declare_stage(tf_host_context* ctx, const tf_stage_spec* spec, int32_t* out_index) {
  return serve(ctx, [&] {
    require(spec, "spec");
    if (!ctx->session->declaring())
      throw std::logic_error("declare_stage is only allowed in a model's create");
    const tf_stage_spec s = read_struct(spec);
    if (s.name == nullptr) throw std::invalid_argument("stage without a name");
    for (const int64_t per_token :
         {s.activation_bytes_per_token, s.frozen_activation_bytes_per_token,
          s.output_bytes_per_token, s.backward_bytes_per_token, s.frozen_backward_bytes_per_token})
      if (per_token < 0 || per_token > kMaxPlannedBytes)
        throw std::invalid_argument(std::string("stage \"") + s.name +
                                    "\" declares a per-token byte count outside [0, 2^56]");
    StageState st;
    st.name = s.name;
    st.kind = s.kind;
    st.device = ctx->session->run_info().device;
    st.activation_bytes_per_token = s.activation_bytes_per_token;
    st.flops_per_token = s.flops_per_token;
    st.frozen_activation_bytes_per_token = s.frozen_activation_bytes_per_token;
    st.output_bytes_per_token = s.output_bytes_per_token;
    st.backward_bytes_per_token = s.backward_bytes_per_token;
    st.frozen_backward_bytes_per_token = s.frozen_backward_bytes_per_token;
    auto& stages = ctx->session->stages();
    stages.push_back(st);
    if (out_index) *out_index = static_cast<int32_t>(stages.size() - 1);
  });
}

tf_status h_weight(tf_host_context* ctx, const char* name, tf_tensor* out) {
  return serve(ctx, [&] {
    require(name, "name");
    require(out, "out");
    *out = give_handle(ctx->session->fetch_weight(name));
  });
}

tf_status h_linear(tf_host_context* ctx, tf_tensor x, const char* weight, const char* bias,
                   tf_tensor* out) {
  return serve(ctx, [&] {
    require(x, "x");
    require(weight, "weight");
    require(out, "out");
    *out = give_handle(ctx->session->linear(handle_tensor(x), weight, bias ? bias : ""));
  });
}

tf_status h_param_count(tf_host_context* ctx, int32_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = static_cast<int32_t>(ctx->session->store().all().size());
  });
}
tf_status h_param_name(tf_host_context* ctx, int32_t index, const char** out) {
  return serve(ctx, [&] {
    require(out, "out");
    auto& all = ctx->session->store().all();
    if (index < 0 || static_cast<size_t>(index) >= all.size())
      throw std::out_of_range("parameter index out of range");
    *out = all[static_cast<size_t>(index)].name.c_str();
  });
}
tf_status h_param_info(tf_host_context* ctx, const char* name, tf_param_info* out) {
  return serve(ctx, [&] {
    require(name, "name");
    check_size(out, "tf_param_info");
    const Param& p = ctx->session->store().get(name);
    tf_param_info info{};
    info.name = p.name.c_str();
    info.ndim = static_cast<int32_t>(p.shape.size());
    for (size_t i = 0; i < p.shape.size() && i < 8; ++i) info.shape[i] = p.shape[i];
    info.dtype = to_tf_dtype(p.dtype);
    info.stage = p.stage;
    info.flags = p.flags;
    info.trainable = p.trainable ? 1 : 0;
    info.format = p.format;
    info.residency = p.residency;
    info.numel = p.numel();
    info.stored_bytes =
        p.value.defined() ? p.value.numel() * static_cast<int64_t>(p.value.element_size()) : 0;
    write_struct(out, info);
  });
}
tf_status h_param_storage(tf_host_context* ctx, const char* name, tf_tensor* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = give_handle(ctx->session->store().get(name).value);
  });
}
tf_status h_param_set_storage(tf_host_context* ctx, const char* name, tf_tensor value,
                              tf_param_format format, tf_residency residency) {
  return serve(ctx, [&] {
    require(value, "value");
    Param& p = ctx->session->store().get(name);
    at::Tensor v = handle_tensor(value).detach();
    // A dense trainable parameter stays an autograd leaf in its new storage.
    if (format == TF_FORMAT_DENSE && p.trainable && at::isFloatingType(v.scalar_type()))
      v.requires_grad_(true);
    p.value = v;
    p.dtype = v.scalar_type();
    p.format = format;
    p.residency = residency;
  });
}
tf_status h_param_set_trainable(tf_host_context* ctx, const char* name, int32_t trainable) {
  return serve(ctx, [&] {
    auto& store = ctx->session->store();
    store.set_trainable(store.get(name), trainable != 0);
  });
}
tf_status h_param_grad(tf_host_context* ctx, const char* name, tf_tensor* out) {
  return serve(ctx, [&] {
    require(out, "out");
    const at::Tensor& g = ctx->session->store().get(name).value.grad();
    if (!g.defined())
      throw std::out_of_range(std::string("parameter \"") + name + "\" has no gradient");
    *out = give_handle(g);
  });
}
tf_status h_param_add(tf_host_context* ctx, const char* name, tf_tensor delta, double alpha) {
  return serve(ctx, [&] {
    require(delta, "delta");
    at::NoGradGuard no_grad;
    Param& p = ctx->session->store().get(name);
    ctx->session->with_resident(p, [&] {
      p.value.add_(handle_tensor(delta).to(p.value.device(), p.value.scalar_type()), alpha);
    });
  });
}

StageState& stage_at(tf_host_context* ctx, int32_t stage) {
  auto& stages = ctx->session->stages();
  if (stage < 0 || static_cast<size_t>(stage) >= stages.size())
    throw std::out_of_range("stage index " + std::to_string(stage) + " out of range (model has " +
                            std::to_string(stages.size()) + " stages)");
  return stages[static_cast<size_t>(stage)];
}

tf_status h_stage_count(tf_host_context* ctx, int32_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = static_cast<int32_t>(ctx->session->stages().size());
  });
}
tf_status h_stage_info(tf_host_context* ctx, int32_t stage, tf_stage_info* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_stage_info");
    const StageState& s = stage_at(ctx, stage);
    tf_stage_info info{};
    info.name = s.name.c_str();
    info.kind = s.kind;
    info.recompute = s.recompute;
    info.skip = s.skip;
    info.trainable = s.trainable;
    info.device = s.device.c_str();
    info.activation_bytes_per_token = s.activation_bytes_per_token;
    info.flops_per_token = s.flops_per_token;
    int32_t n = 0;
    for (const auto& p : ctx->session->store().all())
      if (p.stage == stage) ++n;
    info.n_params = n;
    write_struct(out, info);
  });
}
tf_status h_stage_set_recompute(tf_host_context* ctx, int32_t stage, int32_t on) {
  return serve(ctx, [&] { stage_at(ctx, stage).recompute = on != 0; });
}
tf_status h_stage_set_device(tf_host_context* ctx, int32_t stage, const char* device) {
  return serve(ctx, [&] {
    require(device, "device");
    (void)parse_training_device(device);  // validates the string
    stage_at(ctx, stage).device = device;
  });
}
tf_status h_stage_set_skip(tf_host_context* ctx, int32_t stage, int32_t skip) {
  return serve(ctx, [&] {
    StageState& s = stage_at(ctx, stage);
    if (skip && s.kind != TF_STAGE_BLOCK)
      throw std::invalid_argument("only block stages can be skipped; \"" + s.name +
                                  "\" is not a block");
    if (!skip && s.skip)
      for (const auto& p : ctx->session->store().all())
        if (p.stage == stage && p.absent)
          throw std::invalid_argument("stage \"" + s.name +
                                      "\" was skipped when the model was built; its weights "
                                      "were never loaded, so it cannot run now");
    s.skip = skip != 0;
  });
}
tf_status h_stage_set_trainable(tf_host_context* ctx, int32_t stage, int32_t trainable) {
  return serve(ctx, [&] {
    stage_at(ctx, stage).trainable = trainable != 0;
    auto& store = ctx->session->store();
    for (auto& p : store.all())
      if (p.stage == stage) store.set_trainable(p, trainable != 0);
  });
}

tf_status h_memory_stats(tf_host_context* ctx, tf_memory_stats* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_memory_stats");
    const MemorySnapshot s = MemoryAccounting::instance().snapshot();
    tf_memory_stats m{};
    for (int i = 0; i < TF_MEM_CATEGORY_COUNT; ++i) {
      m.current[i] = s.current[i];
      m.peak[i] = s.peak[i];
    }
    m.total_current = s.total_current;
    m.total_peak = s.total_peak;
    m.budget = s.budget;
    write_struct(out, m);
  });
}
tf_status h_memory_push_category(tf_host_context* ctx, tf_mem_category c) {
  return serve(ctx, [&] {
    if (c < 0 || c >= TF_MEM_CATEGORY_COUNT) throw std::invalid_argument("unknown memory category");
    push_category(c);
  });
}
tf_status h_memory_pop_category(tf_host_context* ctx) {
  return serve(ctx, [&] {
    if (!pop_category()) throw std::logic_error("memory_pop_category without a push");
  });
}

bool covers_positions(const tf_batch* b) {
  return b->struct_size >= offsetof(tf_batch, positions) + sizeof(b->positions);
}

tf_status h_next_batch(tf_host_context* ctx, tf_batch* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_batch");
    auto b = ctx->session->next_batch();
    // Packed rows without their positions would attend across examples.
    if (b.positions.defined() && !covers_positions(out))
      throw std::invalid_argument(
          "the rows are packed ([data] packing = true) and this caller's tf_batch (ABI before "
          "1.3) cannot carry their positions: rebuild the schedule plugin against this "
          "tightfit's plugin_api.h, or set packing = false");
    tf_batch batch{};
    batch.n_tokens = b.tokens.numel();
    batch.tokens = give_handle(std::move(b.tokens));
    batch.targets = give_handle(std::move(b.targets));
    if (b.positions.defined()) batch.positions = give_handle(std::move(b.positions));
    write_struct(out, batch);
  });
}
void h_batch_release(tf_host_context*, tf_batch* batch) {
  if (!batch) return;
  h_tensor_release(batch->tokens);
  h_tensor_release(batch->targets);
  batch->tokens = batch->targets = nullptr;
  if (covers_positions(batch)) {
    h_tensor_release(batch->positions);
    batch->positions = nullptr;
  }
}

// The positions of a batch the caller hands in (undefined: not packed).
at::Tensor batch_positions(const tf_batch* batch) {
  const tf_batch b = read_struct(batch);
  return b.positions ? handle_tensor(b.positions) : at::Tensor();
}

void write_pass(tf_pass_result* out, const PassResult& r) {
  tf_pass_result p{};
  p.loss = r.loss;
  p.n_tokens = r.n_tokens;
  p.finite = r.finite ? 1 : 0;
  write_struct(out, p);
}

tf_status h_forward(tf_host_context* ctx, const tf_batch* batch, tf_pass_result* out) {
  return serve(ctx, [&] {
    check_size(batch, "tf_batch");
    check_size(out, "tf_pass_result");
    write_pass(out,
               ctx->session->run_pass(handle_tensor(batch->tokens), handle_tensor(batch->targets),
                                      false, 1.0, batch_positions(batch)));
  });
}
tf_status h_forward_backward(tf_host_context* ctx, const tf_batch* batch, double loss_scale,
                             tf_pass_result* out) {
  return serve(ctx, [&] {
    check_size(batch, "tf_batch");
    check_size(out, "tf_pass_result");
    write_pass(out,
               ctx->session->run_pass(handle_tensor(batch->tokens), handle_tensor(batch->targets),
                                      true, loss_scale, batch_positions(batch)));
  });
}
tf_status h_zero_grad(tf_host_context* ctx) {
  return serve(ctx, [&] { ctx->session->zero_grad(); });
}
tf_status h_optimizer_step(tf_host_context* ctx) {
  tf_status inner = TF_OK;
  const tf_status st = serve(ctx, [&] { inner = ctx->session->optimizer_step(); });
  if (st != TF_OK) return st;
  if (inner == TF_ERR_NON_FINITE)
    ctx->last_error = "a gradient is not finite; the update was skipped";
  return inner;
}
tf_status h_set_lr(tf_host_context* ctx, double lr) {
  return serve(ctx, [&] {
    if (!(lr >= 0)) throw std::invalid_argument("learning rate must be >= 0");
    ctx->session->optimizer().set_lr(lr);
  });
}
tf_status h_base_lr(tf_host_context* ctx, double* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = ctx->session->optimizer().config().lr;
  });
}
tf_status h_snapshot_take(tf_host_context* ctx, int32_t with_optimizer, int32_t* out_id) {
  return serve(ctx, [&] {
    require(out_id, "out_id");
    *out_id = ctx->session->snapshot_take(with_optimizer != 0);
  });
}
tf_status h_snapshot_restore(tf_host_context* ctx, int32_t id) {
  return serve(ctx, [&] { ctx->session->snapshot_restore(id); });
}
tf_status h_snapshot_drop(tf_host_context* ctx, int32_t id) {
  return serve(ctx, [&] { ctx->session->snapshot_drop(id); });
}
tf_status h_perturb_params(tf_host_context* ctx, uint64_t seed, double scale) {
  return serve(ctx, [&] { ctx->session->perturb_params(seed, scale); });
}
tf_status h_log_metric(tf_host_context* ctx, const char* key, double value) {
  return serve(ctx, [&] {
    require(key, "key");
    ctx->session->step_metrics()[ctx->plugin_name + "." + key] = value;
  });
}

std::string state_key(tf_host_context* ctx, const char* key) {
  require(key, "key");
  return ctx->state_prefix + key;
}
tf_status h_state_put_tensor(tf_host_context* ctx, const char* key, tf_tensor value) {
  return serve(ctx, [&] {
    require(value, "value");
    if (!ctx->state_out)
      throw std::logic_error("state_put_tensor is only allowed inside save_state");
    (*ctx->state_out)[state_key(ctx, key)] = handle_tensor(value).detach().to(at::kCPU).clone();
  });
}
tf_status h_state_get_tensor(tf_host_context* ctx, const char* key, tf_tensor* out) {
  return serve(ctx, [&] {
    require(out, "out");
    if (!ctx->state_in)
      throw std::logic_error("state_get_tensor is only allowed inside load_state");
    auto it = ctx->state_in->find(state_key(ctx, key));
    if (it == ctx->state_in->end())
      throw std::out_of_range(std::string("checkpoint has no state \"") + key + "\"");
    *out = give_handle(it->second.clone());
  });
}
tf_status h_state_put_double(tf_host_context* ctx, const char* key, double value) {
  return serve(ctx, [&] {
    if (!ctx->state_out)
      throw std::logic_error("state_put_double is only allowed inside save_state");
    (*ctx->state_out)[state_key(ctx, key)] = at::full({1}, value, at::kDouble);
  });
}
tf_status h_state_get_double(tf_host_context* ctx, const char* key, double* out) {
  return serve(ctx, [&] {
    require(out, "out");
    if (!ctx->state_in)
      throw std::logic_error("state_get_double is only allowed inside load_state");
    auto it = ctx->state_in->find(state_key(ctx, key));
    if (it == ctx->state_in->end())
      throw std::out_of_range(std::string("checkpoint has no state \"") + key + "\"");
    *out = it->second.item<double>();
  });
}

tf_status h_optimizer_apply(tf_host_context* ctx, const char* name, tf_tensor grad,
                            double grad_scale) {
  return serve(ctx, [&] {
    require(name, "name");
    require(grad, "grad");
    at::NoGradGuard no_grad;
    ctx->session->optimizer_apply(name, handle_tensor(grad), grad_scale);
  });
}

tf_status h_optimizer_info(tf_host_context* ctx, tf_optimizer_info* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_optimizer_info");
    const Optimizer& o = ctx->session->optimizer();
    const OptimizerConfig& c = o.config();
    tf_optimizer_info info{};
    info.name = c.name == "sgd" ? "sgd" : "adamw";
    info.lr = o.lr();
    info.beta1 = c.beta1;
    info.beta2 = c.beta2;
    info.eps = c.eps;
    info.weight_decay = c.weight_decay;
    info.momentum = c.momentum;
    info.step = ctx->session->update_step();
    info.n_state = static_cast<int32_t>(o.slot_names().size());
    write_struct(out, info);
  });
}

tf_status h_set_micro_batch(tf_host_context* ctx, int32_t index, int32_t count) {
  return serve(ctx, [&] { ctx->session->set_micro_batch(index, count); });
}

tf_status h_micro_batch(tf_host_context* ctx, int32_t* index, int32_t* count) {
  return serve(ctx, [&] {
    require(index, "index");
    require(count, "count");
    *index = ctx->session->micro_batch_index();
    *count = ctx->session->micro_batch_count();
  });
}

tf_status h_tensors_save(tf_host_context* ctx, const char* path, int32_t n,
                         const char* const* names, const tf_tensor* tensors,
                         const char* metadata_json) {
  return serve(ctx, [&] {
    require(path, "path");
    if (n < 0) throw std::invalid_argument("n must be >= 0");
    if (n > 0) {
      require(names, "names");
      require(tensors, "tensors");
    }
    std::map<std::string, at::Tensor> out;
    for (int32_t i = 0; i < n; ++i) {
      require(names[i], "names[i]");
      require(tensors[i], "tensors[i]");
      if (!out.emplace(names[i], handle_tensor(tensors[i]).detach().to(at::kCPU)).second)
        throw std::invalid_argument(std::string("tensor name \"") + names[i] + "\" given twice");
    }
    std::map<std::string, std::string> metadata;
    if (metadata_json) {
      const auto j = parse_json(metadata_json, "metadata_json");
      if (!j.is_object()) throw std::invalid_argument("metadata_json is not a JSON object");
      for (const auto& [k, v] : j.items())
        metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
    const std::string tmp = std::string(path) + ".tmp";
    write_safetensors(tmp, out, metadata);
    if (std::rename(tmp.c_str(), path) != 0)
      throw std::runtime_error(std::string("cannot rename ") + tmp + " to " + path + ": " +
                               std::strerror(errno));
  });
}

tf_status h_tensors_load(tf_host_context* ctx, const char* path, const char* name, tf_tensor* out) {
  return serve(ctx, [&] {
    if (path == nullptr) {
      ctx->loaded_path.clear();
      ctx->loaded_tensors.clear();
      return;
    }
    require(name, "name");
    require(out, "out");
    if (ctx->loaded_path != path) {
      ctx->loaded_tensors.clear();
      ctx->loaded_path.clear();
      ctx->loaded_tensors = read_safetensors(path).tensors;
      ctx->loaded_path = path;
    }
    auto it = ctx->loaded_tensors.find(name);
    if (it == ctx->loaded_tensors.end())
      throw std::out_of_range(std::string(path) + " has no tensor \"" + name + "\"");
    *out = give_handle(it->second);
  });
}

tf_status h_optimizer_update(tf_host_context* ctx, const char* name, tf_tensor param,
                             tf_tensor grad, int32_t n_state, const tf_tensor* state) {
  return serve(ctx, [&] {
    require(name, "name");
    require(param, "param");
    require(grad, "grad");
    if (n_state > 0) require(state, "state");
    const Param& p = ctx->session->store().get(name);
    std::vector<at::Tensor*> slots;
    for (int32_t i = 0; i < n_state; ++i) {
      require(state[i], "state[i]");
      slots.push_back(&handle_tensor(state[i]));
    }
    Session& s = *ctx->session;
    s.optimizer().update_with_state(handle_tensor(param), p.decays(), handle_tensor(grad), slots,
                                    s.update_step());
  });
}

ReduceOp to_reduce_op(tf_reduce_op op) {
  switch (op) {
    case TF_REDUCE_SUM:
      return ReduceOp::Sum;
    case TF_REDUCE_AVG:
      return ReduceOp::Avg;
    case TF_REDUCE_MAX:
      return ReduceOp::Max;
    case TF_REDUCE_MIN:
      return ReduceOp::Min;
    case TF_REDUCE_OP_MAX_ENUM:
      break;
  }
  throw std::invalid_argument("unknown reduce op " + std::to_string(static_cast<int>(op)));
}

// Collectives run on the process group; a single process is its own group.
tf_status h_dist_all_reduce(tf_host_context* ctx, tf_tensor t, tf_reduce_op op) {
  return serve(ctx, [&] {
    require(t, "t");
    const ReduceOp r = to_reduce_op(op);
    if (ProcessGroup* pg = ctx->session->process_group()) pg->all_reduce(handle_tensor(t), r);
  });
}
// A group of one: reduce_scatter and all_gather are copies of the same size.
void copy_as_one_rank(at::Tensor& out, const at::Tensor& in, const char* what) {
  if (out.numel() != in.numel())
    throw std::invalid_argument(std::string(what) + ": in and out differ in size (one rank)");
  out.copy_(in.view_as(out));
}
tf_status h_dist_reduce_scatter(tf_host_context* ctx, tf_tensor out, tf_tensor in,
                                tf_reduce_op op) {
  return serve(ctx, [&] {
    require(out, "out");
    require(in, "in");
    const ReduceOp r = to_reduce_op(op);
    if (ProcessGroup* pg = ctx->session->process_group())
      pg->reduce_scatter(handle_tensor(out), handle_tensor(in), r);
    else
      copy_as_one_rank(handle_tensor(out), handle_tensor(in), "reduce_scatter");
  });
}
tf_status h_dist_all_gather(tf_host_context* ctx, tf_tensor out, tf_tensor in) {
  return serve(ctx, [&] {
    require(out, "out");
    require(in, "in");
    if (ProcessGroup* pg = ctx->session->process_group())
      pg->all_gather(handle_tensor(out), handle_tensor(in));
    else
      copy_as_one_rank(handle_tensor(out), handle_tensor(in), "all_gather");
  });
}
tf_status h_dist_broadcast(tf_host_context* ctx, tf_tensor t, int32_t root) {
  return serve(ctx, [&] {
    require(t, "t");
    if (root < 0 || root >= ctx->session->run_info().world_size)
      throw std::invalid_argument("broadcast root " + std::to_string(root) + " is not a rank");
    if (ProcessGroup* pg = ctx->session->process_group()) pg->broadcast(handle_tensor(t), root);
  });
}
tf_status h_dist_barrier(tf_host_context* ctx) {
  return serve(ctx, [&] {
    if (ProcessGroup* pg = ctx->session->process_group()) pg->barrier();
  });
}

std::map<std::string, tf_param_plan>::iterator planned(tf_host_context* ctx, const char* name) {
  require(name, "name");
  if (!ctx->session->planning())
    throw std::logic_error("the planned parameter table is only open inside estimate_memory");
  auto& table = ctx->session->param_plan();
  auto it = table.find(name);
  if (it == table.end())
    throw std::out_of_range(std::string("no planned parameter \"") + name +
                            "\" (absent, in a skipped stage, or not declared)");
  return it;
}
tf_status h_plan_param_get(tf_host_context* ctx, const char* name, tf_param_plan* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_param_plan");
    write_struct(out, planned(ctx, name)->second);
  });
}
tf_status h_plan_param_set(tf_host_context* ctx, const char* name, const tf_param_plan* in) {
  return serve(ctx, [&] {
    require(in, "in");
    tf_param_plan p = read_struct(in);
    if (p.bytes < 0) throw std::invalid_argument("planned bytes must not be negative");
    if (p.tier < 0 || p.tier >= TF_TIER_COUNT) throw std::invalid_argument("no such tier");
    p.struct_size = sizeof p;
    planned(ctx, name)->second = p;
  });
}

tf_host_api make_table() {
  tf_host_api t{};
  t.struct_size = sizeof(tf_host_api);
  t.abi_version = TF_ABI_VERSION;
  t.libtorch_version = host_libtorch_version();
  t.set_error = h_set_error;
  t.last_error = h_last_error;
  t.log = h_log;
  t.config_get_bool = h_config_get_bool;
  t.config_get_int = h_config_get_int;
  t.config_get_double = h_config_get_double;
  t.config_get_string = h_config_get_string;
  t.config_get_list_string = h_config_get_list_string;
  t.config_get_list_int = h_config_get_list_int;
  t.config_has = h_config_has;
  t.run_info = h_run_info;
  t.tensor_release = h_tensor_release;
  t.declare_param = h_declare_param;
  t.declare_stage = h_declare_stage;
  t.weight = h_weight;
  t.linear = h_linear;
  t.param_count = h_param_count;
  t.param_name = h_param_name;
  t.param_info = h_param_info;
  t.param_storage = h_param_storage;
  t.param_set_storage = h_param_set_storage;
  t.param_set_trainable = h_param_set_trainable;
  t.param_grad = h_param_grad;
  t.param_add_ = h_param_add;
  t.stage_count = h_stage_count;
  t.stage_info = h_stage_info;
  t.stage_set_recompute = h_stage_set_recompute;
  t.stage_set_device = h_stage_set_device;
  t.stage_set_skip = h_stage_set_skip;
  t.stage_set_trainable = h_stage_set_trainable;
  t.memory_stats = h_memory_stats;
  t.memory_push_category = h_memory_push_category;
  t.memory_pop_category = h_memory_pop_category;
  t.next_batch = h_next_batch;
  t.batch_release = h_batch_release;
  t.forward = h_forward;
  t.forward_backward = h_forward_backward;
  t.zero_grad = h_zero_grad;
  t.optimizer_step = h_optimizer_step;
  t.set_lr = h_set_lr;
  t.base_lr = h_base_lr;
  t.snapshot_take = h_snapshot_take;
  t.snapshot_restore = h_snapshot_restore;
  t.snapshot_drop = h_snapshot_drop;
  t.perturb_params = h_perturb_params;
  t.log_metric = h_log_metric;
  t.state_put_tensor = h_state_put_tensor;
  t.state_get_tensor = h_state_get_tensor;
  t.state_put_double = h_state_put_double;
  t.state_get_double = h_state_get_double;
  t.optimizer_apply = h_optimizer_apply;
  t.optimizer_info = h_optimizer_info;
  t.set_micro_batch = h_set_micro_batch;
  t.micro_batch = h_micro_batch;
  t.tensors_save = h_tensors_save;
  t.tensors_load = h_tensors_load;
  t.optimizer_update = h_optimizer_update;
  t.dist_all_reduce = h_dist_all_reduce;
  t.dist_reduce_scatter = h_dist_reduce_scatter;
  t.dist_all_gather = h_dist_all_gather;
  t.dist_broadcast = h_dist_broadcast;
  t.dist_barrier = h_dist_barrier;
  t.plan_param_get = h_plan_param_get;
  t.plan_param_set = h_plan_param_set;
  return t;
}

}  // namespace

const tf_host_api* Session::host_api() const {
  static const tf_host_api table = make_table();
  return &table;
}

}  // namespace tightfit
