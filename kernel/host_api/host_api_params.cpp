// Host services: declaring and reading parameters and stages, weights and linear.
// Each catches every exception (serve) so none crosses the ABI.
#include <cmath>
#include <string>
#include <vector>

#include "checked_size.hpp"
#include "device_spec.hpp"
#include "host_api_services.hpp"
#include "memory_accounting.hpp"

namespace tightfit::host_services {

void h_tensor_release(tf_tensor t) {
  release_handle(t);
}

tf_status h_declare_param(tf_host_context* ctx, const tf_param_spec* spec) {
  return serve(ctx, [&] {
    require(spec, "spec");
    if (!ctx->kernel->plugins->declaring)
      throw WrongPhase(
          "declare_param is only allowed in a model's create or a strategy's configure");
    if (spec->struct_size < offsetof(tf_param_spec, tied_to))
      throw std::invalid_argument("tf_param_spec.struct_size too small");
    ctx->kernel->store->declare(read_struct(spec));
  });
}

tf_status h_declare_param_copies(tf_host_context* ctx, const char* prefix, int32_t* out_count) {
  return serve(ctx, [&] {
    require(prefix, "prefix");
    if (!ctx->kernel->plugins->declaring_copies)
      throw WrongPhase("declare_param_copies is only allowed in a schedule's create");
    const int32_t n = ctx->kernel->store->declare_copies(prefix);
    if (out_count) *out_count = n;
  });
}

tf_status h_declare_kept_param_copies(tf_host_context* ctx, const char* prefix, tf_residency tier,
                                      int32_t* out_count) {
  return serve(ctx, [&] {
    require(prefix, "prefix");
    if (!ctx->kernel->plugins->declaring_copies)
      throw WrongPhase("declare_kept_param_copies is only allowed in a schedule's create");
    const int32_t n = ctx->kernel->store->declare_copies(prefix, tier);
    if (out_count) *out_count = n;
  });
}

tf_status h_use_param_copies(tf_host_context* ctx, const char* prefix) {
  return serve(ctx, [&] {
    const std::string p = prefix ? prefix : "";
    if (!p.empty() && !ctx->kernel->store->has_copies(p))
      throw std::invalid_argument("use_param_copies: no copies were declared under \"" + p +
                                  "\" (declare_param_copies in the schedule's create)");
    if (!ctx->kernel->executor)
      throw std::invalid_argument("use_param_copies: no pass can run (a plan runs none)");
    ctx->kernel->executor->use_param_copies(p);
  });
}

tf_status h_declare_stage(tf_host_context* ctx, const tf_stage_spec* spec, int32_t* out_index) {
  return serve(ctx, [&] {
    require(spec, "spec");
    if (!ctx->kernel->plugins->declaring)
      throw WrongPhase("declare_stage is only allowed in a model's create");
    const tf_stage_spec s = read_struct(spec);
    if (s.name == nullptr) throw std::invalid_argument("stage without a name");
    for (const int64_t per_token :
         {s.activation_bytes_per_token, s.frozen_activation_bytes_per_token,
          s.output_bytes_per_token, s.backward_bytes_per_token, s.frozen_backward_bytes_per_token,
          s.decode_cache_bytes_per_token, s.decode_state_bytes})
      if (per_token < 0 || per_token > kMaxPlannedBytes)
        throw std::invalid_argument(std::string("stage \"") + s.name +
                                    "\" declares a per-token byte count outside [0, 2^56]");
    StageState st;
    st.name = s.name;
    st.kind = s.kind;
    st.device = ctx->kernel->env->run_info.device;
    st.activation_bytes_per_token = s.activation_bytes_per_token;
    st.flops_per_token = s.flops_per_token;
    st.frozen_activation_bytes_per_token = s.frozen_activation_bytes_per_token;
    st.output_bytes_per_token = s.output_bytes_per_token;
    st.backward_bytes_per_token = s.backward_bytes_per_token;
    st.frozen_backward_bytes_per_token = s.frozen_backward_bytes_per_token;
    st.decode_cache_bytes_per_token = s.decode_cache_bytes_per_token;
    st.decode_state_bytes = s.decode_state_bytes;
    if (s.tiled_flops_per_token < 0 || s.tiled_flops_per_token > s.flops_per_token)
      throw std::invalid_argument(std::string("stage \"") + s.name +
                                  "\" declares tiled_flops_per_token outside [0, its "
                                  "flops_per_token]");
    st.tiled_flops_per_token = s.tiled_flops_per_token;
    if (s.projection_weight != nullptr) {
      if (s.kind != TF_STAGE_HEAD)
        throw std::invalid_argument(std::string("stage \"") + s.name +
                                    "\" declares a projection_weight but is not a head");
      if (s.projection_bytes_per_token < 0 ||
          s.projection_bytes_per_token >
              std::min(s.activation_bytes_per_token, s.frozen_activation_bytes_per_token > 0
                                                         ? s.frozen_activation_bytes_per_token
                                                         : s.activation_bytes_per_token))
        throw std::invalid_argument(std::string("stage \"") + s.name +
                                    "\" declares projection_bytes_per_token outside [0, its "
                                    "activation bytes per token]");
      st.projection_weight = s.projection_weight;
      st.projection_bias = s.projection_bias ? s.projection_bias : "";
      st.projection_bytes_per_token = s.projection_bytes_per_token;
      // !(x >= 0) also catches NaN.
      if (!(s.projection_softcap >= 0) || !std::isfinite(s.projection_softcap))
        throw std::invalid_argument(std::string("stage \"") + s.name +
                                    "\" declares a projection_softcap that is not a finite "
                                    "number >= 0 (0: no cap)");
      st.projection_softcap = s.projection_softcap;
    }
    auto& stages = ctx->kernel->executor->stages();
    stages.push_back(st);
    if (out_index) *out_index = static_cast<int32_t>(stages.size() - 1);
  });
}

tf_status h_weight(tf_host_context* ctx, const char* name, tf_tensor* out) {
  return serve(ctx, [&] {
    require(name, "name");
    require(out, "out");
    *out = give_handle(ctx->kernel->executor->fetch_weight(name));
  });
}

tf_status h_expect_weights(tf_host_context* ctx, const char* const* names, int32_t count) {
  return serve(ctx, [&] {
    if (count < 0) throw std::invalid_argument("expect_weights: count < 0");
    if (count > 0) require(names, "names");
    std::vector<std::string> list;
    for (int32_t i = 0; i < count; ++i) {
      require(names[i], "names[i]");
      list.emplace_back(names[i]);
    }
    // A hint: without a pass (a plan) there is nothing to read ahead.
    if (ctx->kernel->executor) ctx->kernel->executor->expect_weights(list);
  });
}

tf_status h_linear(tf_host_context* ctx, tf_tensor x, const char* weight, const char* bias,
                   tf_tensor* out) {
  return serve(ctx, [&] {
    require(x, "x");
    require(weight, "weight");
    require(out, "out");
    *out = give_handle(ctx->kernel->executor->linear(handle_tensor(x), weight, bias ? bias : ""));
  });
}

tf_status h_param_count(tf_host_context* ctx, int32_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    // The copies the kernel keeps are not the plugins' to place.
    *out = static_cast<int32_t>(ctx->kernel->store->plugins_see());
  });
}
tf_status h_param_name(tf_host_context* ctx, int32_t index, const char** out) {
  return serve(ctx, [&] {
    require(out, "out");
    auto& all = ctx->kernel->store->all();
    if (index < 0 || static_cast<size_t>(index) >= ctx->kernel->store->plugins_see())
      throw std::out_of_range("parameter index out of range");
    *out = intern(all[static_cast<size_t>(index)].name);
  });
}
tf_status h_param_info(tf_host_context* ctx, const char* name, tf_param_info* out) {
  return serve(ctx, [&] {
    require(name, "name");
    check_size(out, "tf_param_info");
    const Param& p = ctx->kernel->store->get(name);
    tf_param_info info{};
    constexpr size_t kMaxRank = sizeof(info.shape) / sizeof(info.shape[0]);
    if (p.shape.size() > kMaxRank)
      throw std::invalid_argument("parameter \"" + p.name + "\" has rank " +
                                  std::to_string(p.shape.size()) + ", past tf_param_info's " +
                                  std::to_string(kMaxRank));
    info.name = intern(p.name);
    info.ndim = static_cast<int32_t>(p.shape.size());
    for (size_t i = 0; i < p.shape.size(); ++i) info.shape[i] = p.shape[i];
    info.dtype = to_tf_dtype(p.dtype);
    info.stage = p.stage;
    info.flags = p.flags;
    info.trainable = p.trainable ? 1 : 0;
    info.format = p.format;
    info.residency = p.residency;
    info.numel = p.numel();
    info.stored_bytes =
        p.value.defined() ? p.value.numel() * static_cast<int64_t>(p.value.element_size()) : 0;
    info.routed_share = p.routed_share;
    write_struct(out, info);
  });
}
tf_status h_param_storage(tf_host_context* ctx, const char* name, tf_tensor* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = give_handle(ctx->kernel->store->get(name).value);
  });
}
tf_status h_param_set_storage(tf_host_context* ctx, const char* name, tf_tensor value,
                              tf_param_format format, tf_residency residency) {
  return serve(ctx, [&] {
    require(value, "value");
    Param& p = ctx->kernel->store->get(name);
    at::Tensor v = handle_tensor(value).detach();
    if (p.kept_by_host) {
      // A copy the kernel keeps takes values (a schedule's from an older
      // checkpoint), never another format or tier.
      const Param& live = ctx->kernel->store->get(p.copy_of);
      if (format != TF_FORMAT_DENSE || residency != p.residency || v.sizes() != live.value.sizes())
        throw std::invalid_argument("\"" + p.name +
                                    "\" is a copy the kernel keeps: it takes dense values of " +
                                    live.name + "'s shape in its own tier");
      at::NoGradGuard no_grad;
      const CategoryScope scope(TF_MEM_WEIGHTS);
      p.value = ParamStore::kept_copy_of(p, v, live.value);
      p.dtype = p.value.scalar_type();
      return;
    }
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
    auto& store = *ctx->kernel->store;
    store.set_trainable(store.get(name), trainable != 0);
  });
}
tf_status h_param_grad(tf_host_context* ctx, const char* name, tf_tensor* out) {
  return serve(ctx, [&] {
    require(out, "out");
    const at::Tensor& g = ctx->kernel->store->get(name).value.grad();
    if (!g.defined())
      throw std::out_of_range(std::string("parameter \"") + name + "\" has no gradient");
    *out = give_handle(g);
  });
}
tf_status h_param_add_(tf_host_context* ctx, const char* name, tf_tensor delta, double alpha) {
  return serve(ctx, [&] {
    require(delta, "delta");
    at::NoGradGuard no_grad;
    Param& p = ctx->kernel->store->get(name);
    ctx->kernel->executor->with_resident(p, [&] {
      p.value.add_(handle_tensor(delta).to(p.value.device(), p.value.scalar_type()), alpha);
    });
  });
}

static StageState& stage_at(tf_host_context* ctx, int32_t stage) {
  auto& stages = ctx->kernel->executor->stages();
  if (stage < 0 || static_cast<size_t>(stage) >= stages.size())
    throw std::out_of_range("stage index " + std::to_string(stage) + " out of range (model has " +
                            std::to_string(stages.size()) + " stages)");
  return stages[static_cast<size_t>(stage)];
}

tf_status h_stage_count(tf_host_context* ctx, int32_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = static_cast<int32_t>(ctx->kernel->executor->stages().size());
  });
}
tf_status h_stage_info(tf_host_context* ctx, int32_t stage, tf_stage_info* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_stage_info");
    const StageState& s = stage_at(ctx, stage);
    tf_stage_info info{};
    info.name = intern(s.name);
    info.kind = s.kind;
    info.recompute = s.recompute;
    info.skip = s.skip;
    info.trainable = s.trainable;
    info.device = intern(s.device);
    info.activation_bytes_per_token = s.activation_bytes_per_token;
    info.flops_per_token = s.flops_per_token;
    int32_t n = 0;
    for (const auto& p : ctx->kernel->store->all())
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
      for (const auto& p : ctx->kernel->store->all())
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
    auto& store = *ctx->kernel->store;
    for (auto& p : store.all())  // a reference's copies stay frozen
      if (p.stage == stage && !(p.flags & TF_PARAM_COPY)) store.set_trainable(p, trainable != 0);
  });
}

}  // namespace tightfit::host_services
