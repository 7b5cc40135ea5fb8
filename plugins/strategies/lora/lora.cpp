// LoRA (Hu et al. 2021) as a strategy plugin: low-rank adapters on chosen
// projections, base weights frozen.
//
//   y = x W^T + (alpha / r) * dropout(x) A^T B^T,   A: [r, in], B: [out, r], B = 0 at start
//
// configure declares A and B for every targeted weight (names as PEFT writes
// them under base_model.model.: "<module>.lora_A.weight") and freezes every
// other parameter; linear_extend adds the low-rank term. With quantize after
// it in the recipe this is QLoRA.
#include "lora.hpp"

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

// Recipe short names for the projections of the built-in models.
const std::map<std::string, std::vector<std::string>> kAliases = {
    // GPT-2's c_attn and Phi-3's qkv_proj are q, k and v in one
    {"q", {"q_proj", "attn.c_attn", "qkv_proj"}},
    {"k", {"k_proj", "attn.c_attn", "attention.key", "qkv_proj"}},
    {"v", {"v_proj", "attn.c_attn", "attention.value", "qkv_proj"}},
    {"o", {"o_proj", "attn.c_proj", "attention.output"}},
    // Phi-3's gate_up_proj is gate and up in one; Mixtral's experts call
    // gate, up and down w1, w3 and w2.
    {"gate", {"gate_proj", "gate_up_proj", ".w1."}},
    {"up", {"up_proj", "mlp.c_fc", "feed_forward.key", "gate_up_proj", ".w3."}},
    {"down", {"down_proj", "mlp.c_proj", "feed_forward.value", ".w2."}},
};

using lora::Adapter;
using lora::Lora;

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Lora>(Lora{tf_sdk::Host(api, ctx)});
    s->rank = s->host.get_int("rank");
    s->alpha = s->host.get_double("alpha");
    s->scale = s->alpha / static_cast<double>(s->rank);
    s->adapter_dir = s->host.get_string("adapter");
    s->dropout = s->host.get_double("dropout");
    *out = s.release();
    return TF_OK;
  });
}

tf_status configure(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Lora*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    std::vector<std::string> patterns;
    std::string listed;
    for (const std::string& t : s->host.get_string_list("targets")) {
      listed += (listed.empty() ? "" : ", ") + t;
      auto alias = kAliases.find(t);
      if (alias != kAliases.end())
        patterns.insert(patterns.end(), alias->second.begin(), alias->second.end());
      else
        patterns.emplace_back(t);
    }
    const std::vector<std::string> names = s->host.param_names();
    std::string linear_weights;
    for (const auto& name : names) {
      const tf_param_info info = s->host.param_info(name);
      if (info.ndim != 2 || info.stage < 0 || name.size() < 7 ||
          name.compare(name.size() - 7, 7, ".weight") != 0 ||
          s->host.stage_info(info.stage).kind != TF_STAGE_BLOCK)
        continue;
      linear_weights += (linear_weights.empty() ? "" : ", ") + name;
      bool hit = false;
      for (const auto& p : patterns) hit |= name.find(p) != std::string::npos;
      // A block that sparse skips (strategy before this one) gets no adapter.
      if (!hit || s->host.stage_info(info.stage).skip) continue;
      const std::string module = name.substr(0, name.size() - 7);
      const int64_t out_f = info.shape[0], in_f = info.shape[1];
      Adapter ad{module + ".lora_A.weight", module + ".lora_B.weight"};
      // A as PEFT initializes it (Kaiming-uniform bound 1/sqrt(in)), B zero: the model starts
      // unchanged.
      // An adapter on a routed expert is used only when the expert is (ABI 1.15).
      // Its share of the tokens is the expert's (ABI 1.17; 0 from an older host).
      const uint32_t flags = TF_PARAM_ADAPTER | (info.flags & TF_PARAM_EXPERT);
      const double share =
          TF_SDK_REACHES(&info, tf_param_info, routed_share) ? info.routed_share : 0;
      s->host.declare_param(ad.a, {s->rank, in_f}, info.dtype, info.stage, TF_INIT_UNIFORM,
                            1.0 / std::sqrt(static_cast<double>(in_f)), flags, share);
      s->host.declare_param(ad.b, {out_f, s->rank}, info.dtype, info.stage, TF_INIT_ZEROS, 0, flags,
                            share);
      s->adapters[name] = ad;
    }
    if (s->adapters.empty())
      throw std::invalid_argument("lora: targets [" + listed +
                                  "] match no linear weight of this model. Its block "
                                  "linear weights are: " +
                                  linear_weights);
    // The base is frozen; only the adapters train.
    for (const auto& name : names) s->host.set_param_trainable(name, false);
    std::ostringstream msg;
    msg << "rank " << s->rank << " adapters on " << s->adapters.size() << " weights; base frozen";
    s->host.log(TF_LOG_INFO, msg.str());
    return TF_OK;
  });
}

tf_status linear_extend(void* state, tf_host_context* ctx, const char* weight, tf_tensor x_h,
                        tf_tensor y_h, tf_tensor* out) {
  auto* s = static_cast<Lora*>(state);
  auto it = s->adapters.find(weight);
  if (it == s->adapters.end() || !s->enabled) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    at::Tensor x = tf_sdk::borrow(x_h);
    if (s->dropout > 0 && at::GradMode::is_enabled()) x = at::dropout(x, s->dropout, true);
    const at::Tensor a = s->host.weight(it->second.a), b = s->host.weight(it->second.b);
    // The adapters may be stored in another dtype than the base computes in
    // (precision's bf16 weights over an fp32 dequantized base): like PEFT,
    // compute the low-rank term in the adapters' dtype and add it in y's.
    const at::Tensor& y = tf_sdk::borrow(y_h);
    const at::Tensor term = at::linear(at::linear(x.to(a.scalar_type()), a), b) * s->scale;
    *out = tf_sdk::give(y + term.to(y.scalar_type()));
    return TF_OK;
  });
}

// Off, linear_extend adds nothing: the base model, as PEFT's disable_adapter().
tf_status set_adapters_enabled(void* state, tf_host_context*, int32_t enabled) {
  auto* s = static_cast<Lora*>(state);
  if (s->adapters.empty()) return TF_NOT_HANDLED;
  s->enabled = enabled != 0;
  return TF_OK;
}

// Exports merge the adapter into its base: W + (alpha / r) B A.
tf_status export_weight(void* state, tf_host_context* ctx, const char* name, tf_tensor dense,
                        tf_tensor* out) {
  auto* s = static_cast<Lora*>(state);
  auto it = s->adapters.find(name);
  if (it == s->adapters.end()) return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    at::NoGradGuard no_grad;
    const at::Tensor a = s->host.weight(it->second.a), b = s->host.weight(it->second.b);
    const at::Tensor& w = tf_sdk::borrow(dense);
    *out = tf_sdk::give(
        (w.to(at::kFloat) + at::matmul(b, a).to(at::kFloat) * s->scale).to(w.scalar_type()));
    return TF_OK;
  });
}

// A PEFT adapter folder given as `adapter` replaces the initial A and B.
tf_status params_ready(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Lora*>(state);
  if (s->adapter_dir.empty()) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    lora::read_peft_adapter(*s, s->adapter_dir);
    s->host.log(TF_LOG_INFO, "adapters loaded from " + s->adapter_dir);
    return TF_OK;
  });
}

tf_status export_adapter(void* state, tf_host_context* ctx, const char* dir) {
  auto* s = static_cast<Lora*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    lora::write_peft_adapter(*s, dir);
    return TF_OK;
  });
}

// Adapters add 2 r (in + out) values per target, trained: weights, grads and
// two AdamW moments; the frozen base needs no gradients or optimizer state.
// The kernel's plan counts the adapters, their gradients and optimizer
// state and the frozen bases (declared in configure). What LoRA adds is
// activations: an adapter keeps its input (the frozen linear would not) —
// once per stage and input width, as projections of one block that share a
// width mostly share their input (q, k, v) — and its rank-r middle.
// Each adapter keeps its input (one per input width and module: q, k and v
// share the block's) and its rank-wide A x for the weight gradients, per
// token the base weight sees: an adapter on a routed expert (routed_share,
// ABI 1.17) only for the tokens routed to that expert, one input per expert
// (its gate and up share theirs), so a layer's experts together keep top_k
// copies of each token.
// Which tensor a projection reads, for counting each kept input once:
// projections of a stage as wide as one another are taken to read one
// tensor (q, k and v the attention's input, gate and up the feed-forward's,
// an RWKV block's mixes), but an attention's output projection (o_proj,
// out_proj) reads the attention's output, its own tensor however wide, and
// an expert (a share of the tokens) reads its own rows.
std::string input_read_by(const std::string& weight, bool routed) {
  const std::string module = weight.substr(0, weight.rfind('.', weight.size() - 8));
  if (routed) return module;  // "...experts.7" of "...experts.7.w1.weight"
  for (const char* own : {"o_proj.", "out_proj."})
    if (weight.find(own) != std::string::npos) return weight;
  return std::string();
}

tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Lora*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const double tokens = static_cast<double>(model->batch_size * model->seq_len);
    std::set<std::tuple<int32_t, int64_t, std::string>> inputs;  // (stage, width, tensor read)
    double bytes = 0;
    for (const auto& [name, ad] : s->adapters) {
      const tf_param_info info = s->host.param_info(name);
      const int64_t elt = tf_sdk::element_bytes(info.dtype);
      if (info.stage >= 0 && s->host.stage_info(info.stage).skip) continue;
      const double share =
          TF_SDK_REACHES(&info, tf_param_info, routed_share) && info.routed_share > 0
              ? info.routed_share
              : 1.0;
      const double rows = tokens * share;
      if (inputs.insert({info.stage, info.shape[1], input_read_by(name, share < 1)}).second)
        bytes += rows * static_cast<double>(info.shape[1] * elt);
      bytes += rows * static_cast<double>(s->rank * elt);
    }
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_ACTIVATIONS] = static_cast<int64_t>(std::ceil(bytes));
    out->time_factor = 0;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    return TF_OK;
  });
}

// `tightfit fit` keeps a recipe's adapters and their rank (what trains is
// the user's choice), and turns to them at these ranks only when asked or
// when nothing training all weights fits; alpha follows the rank it picks.
const tf_plugin_search kSearch = {.struct_size = sizeof(tf_plugin_search),
                                  .flags = TF_SEARCH_PLUGIN_TRAINS_ADAPTERS,
                                  .label = "lora",
                                  .approximation = "LoRA",
                                  .quality_penalty = 3.0,
                                  .stack_order = 0};
// A higher rank is closer to training the weights (and saves less).
const tf_search_value kRanks[] = {
    tf_sdk::search_value("64", "lora r{}", nullptr, -0.6),
    tf_sdk::search_value("16", "lora r{}", nullptr, -0.4),
    tf_sdk::search_value("8", "lora r{}", nullptr, -0.3),
};
const tf_key_search kRankSearch =
    tf_sdk::key_search(kRanks, TF_SEARCH_KEY_RECIPES_CHOICE | TF_SEARCH_KEY_RANK);
const tf_key_search kAlphaFollows = {
    .struct_size = sizeof(tf_key_search), .flags = TF_SEARCH_KEY_FOLLOWS, .with = "rank"};

const tf_config_key kKeys[] = {
    tf_sdk::key("targets", TF_VALUE_STRING_LIST, "[\"q\", \"v\"]",
                "projections to adapt: q k v o gate up down, or any substring of a weight's name"),
    tf_sdk::searched(tf_sdk::key("rank", TF_VALUE_INT, "8", "adapter rank r", 1, 4096),
                     kRankSearch),
    tf_sdk::searched(tf_sdk::key("alpha", TF_VALUE_FLOAT, "16.0",
                                 "scaling numerator: the update is (alpha / r) B A x", 0, 1e6),
                     kAlphaFollows),
    tf_sdk::key("dropout", TF_VALUE_FLOAT, "0.0", "dropout on the adapter input in training", 0, 1),
    tf_sdk::key(
        "adapter", TF_VALUE_STRING, "\"\"",
        "a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) to start from"),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Lora>,
                                    .configure = configure,
                                    .params_ready = params_ready,
                                    .linear_extend = linear_extend,
                                    .estimate_memory = estimate_memory,
                                    .export_weight = export_weight,
                                    .export_adapter = export_adapter,
                                    .set_adapters_enabled = set_adapters_enabled};

const tf_plugin_descriptor kDescriptor = tf_sdk::searched(
    tf_sdk::describe(TF_PLUGIN_STRATEGY, "lora", "1.0.0",
                     "low-rank adapters on chosen projections, base frozen (with quantize: QLoRA)",
                     kKeys, &kVtable),
    kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
