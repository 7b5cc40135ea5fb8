// LLaMA (Touvron et al. 2023; LLaMA-2, LLaMA-3) as a tightfit model plugin,
// with Hugging Face LlamaForCausalLM parameter names.
//
//   h_0    = E[x]
//   a_l    = h_{l-1} + W_o Attn(RoPE(W_q u), RoPE(W_k u), W_v u),   u = RMSNorm_1(h_{l-1})
//   h_l    = a_l + W_down (silu(W_gate v) * W_up v),                 v = RMSNorm_2(a_l)
//   logits = RMSNorm_f(h_L) W_lm^T          (W_lm = E when embeddings are tied)
//
// Grouped-query attention: n_kv_head key/value heads, each shared by
// n_head / n_kv_head query heads. Rotary embeddings with the theta and the
// scaling ("linear" or Llama 3's frequency-dependent) a config gives.
#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tightfit/activation_bytes.hpp"
#include "tightfit/hf_config.hpp"
#include "tightfit/plugin_sdk.hpp"

namespace {

struct Shape {
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_kv_head = 0, intermediate = 0, vocab = 0,
          max_positions = 0;
  double rope_theta = 10000.0, rms_eps = 1e-5;
  bool tie_embeddings = false;
  std::string rope_scaling = "none";  // none | linear | llama3
  double rope_factor = 1.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int64_t rope_original_max_positions = 8192;
};

struct Preset {
  const char* name;
  Shape shape;
};

Shape make(int64_t L, int64_t C, int64_t H, int64_t KVH, int64_t I, int64_t V, int64_t P,
           double theta, bool tie) {
  Shape s;
  s.n_layer = L, s.n_embd = C, s.n_head = H, s.n_kv_head = KVH, s.intermediate = I, s.vocab = V;
  s.max_positions = P, s.rope_theta = theta, s.tie_embeddings = tie;
  return s;
}

const std::array<Preset, 6>& presets() {
  static const std::array<Preset, 6> p = [] {
    Shape one_b = make(16, 2048, 32, 8, 8192, 128256, 131072, 500000.0, true);  // Llama-3.2-1B
    one_b.rope_scaling = "llama3";
    one_b.rope_factor = 32.0;
    one_b.rope_low_freq_factor = 1.0;
    one_b.rope_high_freq_factor = 4.0;
    one_b.rope_original_max_positions = 8192;
    return std::array<Preset, 6>{{
        {"tiny", make(4, 128, 4, 2, 352, 0, 512, 10000.0, false)},
        {"1B", one_b},
        {"7B", make(32, 4096, 32, 32, 11008, 32000, 4096, 10000.0, false)},   // Llama-2-7B
        {"13B", make(40, 5120, 40, 40, 13824, 32000, 4096, 10000.0, false)},  // Llama-2-13B
        {"30B", make(60, 6656, 52, 52, 17920, 32000, 2048, 10000.0, false)},  // LLaMA-30B (33B)
        {"70B", make(80, 8192, 64, 8, 28672, 32000, 4096, 10000.0, false)},   // Llama-2-70B
    }};
  }();
  return p;
}

// Reads the shape from a Hugging Face config.json (file or model folder).
Shape shape_from_hf_config(const std::string& path) {
  const tf_sdk::HfConfig c = tf_sdk::read_hf_config(path);
  const nlohmann::json& j = c.json;
  Shape s;
  s.n_layer = c.need("num_hidden_layers");
  s.n_embd = c.need("hidden_size");
  s.n_head = c.need("num_attention_heads");
  s.n_kv_head = c.get("num_key_value_heads", s.n_head);
  s.intermediate = c.need("intermediate_size");
  s.vocab = c.need("vocab_size");
  s.max_positions = c.get("max_position_embeddings", 2048);
  s.rope_theta = j.value("rope_theta", 10000.0);
  s.rms_eps = j.value("rms_norm_eps", 1e-6);
  s.tie_embeddings = j.value("tie_word_embeddings", false);
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const auto& r = j["rope_scaling"];
    const std::string type = r.value("rope_type", r.value("type", std::string("default")));
    if (type == "linear" || type == "llama3")
      s.rope_scaling = type;
    else if (type != "default")
      throw std::invalid_argument(c.source + ": rope_scaling type \"" + type +
                                  "\" is not supported (default, linear, llama3)");
    s.rope_factor = r.value("factor", 1.0);
    s.rope_low_freq_factor = r.value("low_freq_factor", 1.0);
    s.rope_high_freq_factor = r.value("high_freq_factor", 4.0);
    s.rope_original_max_positions = r.value("original_max_position_embeddings", int64_t{8192});
  }
  return s;
}

// Rotary inverse frequencies, scaled as the config says.
at::Tensor rope_inv_freq(const Shape& s, int64_t head_dim) {
  at::Tensor inv =
      1.0 / at::pow(s.rope_theta, at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) /
                                      static_cast<double>(head_dim));
  if (s.rope_scaling == "linear") return inv / s.rope_factor;
  if (s.rope_scaling != "llama3") return inv;
  const double old_ctx = static_cast<double>(s.rope_original_max_positions);
  const double low_wavelen = old_ctx / s.rope_low_freq_factor,
               high_wavelen = old_ctx / s.rope_high_freq_factor;
  at::Tensor wavelen = 2.0 * M_PI / inv;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv / s.rope_factor, inv);
  at::Tensor smooth = (old_ctx / wavelen - s.rope_low_freq_factor) /
                      (s.rope_high_freq_factor - s.rope_low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / s.rope_factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

struct Llama {
  tf_sdk::Host host;
  Shape s;
  at::ScalarType dtype = at::kFloat;
  at::Tensor inv_freq;    // [head_dim / 2], fp32
  std::string hf_config;  // config.json for export

  int64_t head_dim() const { return s.n_embd / s.n_head; }
  std::string layer(int64_t l, const char* rest) const {
    return "model.layers." + std::to_string(l) + "." + rest;
  }

  at::Tensor rms_norm(const at::Tensor& x, const std::string& weight) const {
    // In fp32, as the reference does, then back to the activations' dtype.
    at::Tensor xf = x.to(at::kFloat);
    xf = xf * at::rsqrt(xf.pow(2).mean(-1, true) + s.rms_eps);
    return host.weight(weight) * xf.to(x.scalar_type());
  }

  // x: [B, heads, T, D]; rotate pairs (i, i + D/2) by position * inv_freq.
  at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const {
    const int64_t half = x.size(-1) / 2;
    at::Tensor rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
    return x * cos + rotated * sin;
  }

  at::Tensor attention(const at::Tensor& u, int64_t l) const {
    const int64_t B = u.size(0), T = u.size(1), H = s.n_head, KVH = s.n_kv_head, D = head_dim();
    at::Tensor q =
        host.linear(u, layer(l, "self_attn.q_proj.weight")).view({B, T, H, D}).transpose(1, 2);
    at::Tensor k =
        host.linear(u, layer(l, "self_attn.k_proj.weight")).view({B, T, KVH, D}).transpose(1, 2);
    at::Tensor v =
        host.linear(u, layer(l, "self_attn.v_proj.weight")).view({B, T, KVH, D}).transpose(1, 2);
    at::Tensor angles =
        at::outer(at::arange(T, at::kFloat).to(inv_freq.device()), inv_freq);  // [T, D/2]
    at::Tensor emb = at::cat({angles, angles}, -1);
    at::Tensor cos = emb.cos().to(q.scalar_type()), sin = emb.sin().to(q.scalar_type());
    q = rope(q, cos, sin);
    k = rope(k, cos, sin);
    if (KVH != H) {  // each key/value head serves H / KVH query heads
      k = k.repeat_interleave(H / KVH, 1);
      v = v.repeat_interleave(H / KVH, 1);
    }
    at::Tensor y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    return host.linear(y.transpose(1, 2).reshape({B, T, H * D}),
                       layer(l, "self_attn.o_proj.weight"));
  }

  at::Tensor mlp(const at::Tensor& v, int64_t l) const {
    at::Tensor gate = at::silu(host.linear(v, layer(l, "mlp.gate_proj.weight")));
    return host.linear(gate * host.linear(v, layer(l, "mlp.up_proj.weight")),
                       layer(l, "mlp.down_proj.weight"));
  }

  at::Tensor block(const at::Tensor& h, int64_t l) const {
    at::Tensor a = h + attention(rms_norm(h, layer(l, "input_layernorm.weight")), l);
    return a + mlp(rms_norm(a, layer(l, "post_attention_layernorm.weight")), l);
  }

  at::Tensor embed(const at::Tensor& tokens) const {
    TORCH_CHECK(tokens.size(1) <= s.max_positions, "sequence of ", tokens.size(1),
                " tokens is longer than max_positions = ", s.max_positions);
    // Tied, E is also the head, whose dense gradient reaches it first: the
    // lookup's sparse gradient adds its rows into it (no second [V, C] tensor).
    // Untied, the lookup's gradient is E's whole gradient and stays dense.
    return at::embedding(host.weight("model.embed_tokens.weight"), tokens, -1, false,
                         /*sparse=*/s.tie_embeddings);
  }

  at::Tensor head(const at::Tensor& h) const {
    return host.linear(rms_norm(h, "model.norm.weight"),
                       s.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  }
};

void declare(const Llama& m, const std::string& name, std::vector<int64_t> shape, int32_t stage,
             tf_init_kind init, double std, uint32_t flags) {
  m.host.declare_param(name, std::move(shape), tf_sdk::parse_dtype(m.host.get_string("dtype")),
                       stage, init, std, flags);
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto m = std::make_unique<Llama>(Llama{tf_sdk::Host(api, ctx)});
    const tf_sdk::Host& host = m->host;
    const std::string preset = host.get_string("preset");
    const std::string config = host.get_string("config");
    if (!config.empty()) {
      m->s = shape_from_hf_config(config);
    } else {
      bool found = preset == "custom";
      for (const auto& p : presets())
        if (preset == p.name) {
          m->s = p.shape;
          found = true;
        }
      if (!found) throw std::invalid_argument("unknown preset \"" + preset + "\"");
    }
    Shape& s = m->s;
    const tf_run_info info = host.run_info();
    auto override_int = [&](const char* key, int64_t& field) {
      if (host.has(key)) field = host.get_int(key);
    };
    override_int("n_layer", s.n_layer);
    override_int("n_embd", s.n_embd);
    override_int("n_head", s.n_head);
    override_int("n_kv_head", s.n_kv_head);
    override_int("intermediate_size", s.intermediate);
    override_int("vocab_size", s.vocab);
    override_int("max_positions", s.max_positions);
    override_int("rope_original_max_positions", s.rope_original_max_positions);
    if (host.has("rope_theta")) s.rope_theta = host.get_double("rope_theta");
    if (host.has("rms_eps")) s.rms_eps = host.get_double("rms_eps");
    if (host.has("tie_embeddings")) s.tie_embeddings = host.get_bool("tie_embeddings");
    if (host.has("rope_scaling")) s.rope_scaling = host.get_string("rope_scaling");
    if (host.has("rope_factor")) s.rope_factor = host.get_double("rope_factor");
    if (host.has("rope_low_freq_factor"))
      s.rope_low_freq_factor = host.get_double("rope_low_freq_factor");
    if (host.has("rope_high_freq_factor"))
      s.rope_high_freq_factor = host.get_double("rope_high_freq_factor");
    if (s.n_kv_head == 0) s.n_kv_head = s.n_head;
    if (s.vocab == 0) s.vocab = info.vocab_size;
    if (s.n_layer <= 0 || s.n_embd <= 0 || s.n_head <= 0 || s.intermediate <= 0 ||
        s.max_positions <= 0)
      throw std::invalid_argument(
          "preset \"custom\" needs n_layer, n_embd, n_head, intermediate_size, max_positions");
    if (s.n_embd % s.n_head != 0 || (s.n_embd / s.n_head) % 2 != 0)
      throw std::invalid_argument("n_embd / n_head must be an even integer (rotary pairs)");
    if (s.n_head % s.n_kv_head != 0)
      throw std::invalid_argument(
          "n_head = " + std::to_string(s.n_head) +
          " is not a multiple of n_kv_head = " + std::to_string(s.n_kv_head));
    if (s.vocab < info.vocab_size)
      throw std::invalid_argument("vocab_size = " + std::to_string(s.vocab) +
                                  " is smaller than the tokenizer's " +
                                  std::to_string(info.vocab_size));
    if (info.seq_len > s.max_positions)
      throw std::invalid_argument("[data] seq_len exceeds max_positions = " +
                                  std::to_string(s.max_positions));
    m->dtype = tf_sdk::scalar_type(tf_sdk::parse_dtype(host.get_string("dtype")));
    m->inv_freq = rope_inv_freq(s, m->head_dim());
    if (!tf_sdk::planning_only(info)) m->inv_freq = m->inv_freq.to(at::Device(info.device));

    const int64_t L = s.n_layer, C = s.n_embd, V = s.vocab, D = m->head_dim(), I = s.intermediate;
    const int64_t KV = s.n_kv_head * D, elt = m->dtype == at::kFloat ? 4 : 2, T = info.seq_len;
    const uint32_t no_decay = TF_PARAM_NO_WEIGHT_DECAY;
    const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));

    // Activation bytes per token autograd keeps (for `plan`). RMSNorm keeps
    // its fp32 input (a copy unless the activations are fp32), the normalized
    // value and the scaled output (the projections' input); attention keeps
    // rotated q, k and v as attention sees them (repeated for grouped
    // heads: C each) and its output; the MLP its input's gate, up, silu(gate)
    // and their product (4 I). Small fp32 statistics round it off.
    // Frozen, a norm keeps only its fp32 input and the MLP gate's input, silu
    // of it and up (3 I): the linears' inputs and the norms' outputs go.
    const int64_t rms_norm_bytes = 4 * C + 2 * elt * C, frozen_norm_bytes = 4 * C;
    const int64_t extra = 72 + tf_sdk::attention_lse_bytes(s.n_head);
    const int64_t block_bytes = 2 * rms_norm_bytes + 4 * elt * C + 4 * elt * I + extra;
    const int64_t frozen_block_bytes = 2 * frozen_norm_bytes + 4 * elt * C + 3 * elt * I + extra;
    // Gradients alive at once at the peak of a block's backward, measured:
    // in the MLP, those of h, silu(gate) and up with the residual's; trained,
    // the saved inputs the weight gradients used are gone by then.
    const int64_t backward_bytes = (I + 2 * C) * elt, frozen_backward_bytes = (3 * I + C) * elt;
    m->host.declare_stage("embed", TF_STAGE_EMBED, 0, 0, 0, C * elt);
    declare(*m, "model.embed_tokens.weight", {V, C}, s.tie_embeddings ? -1 : 0, TF_INIT_NORMAL, std,
            0);
    for (int64_t l = 0; l < L; ++l) {
      const int32_t st = m->host.declare_stage(
          "block." + std::to_string(l), TF_STAGE_BLOCK,
          {block_bytes, frozen_block_bytes, C * elt, backward_bytes, frozen_backward_bytes},
          2 * (2 * C * C + 2 * C * KV + 3 * C * I) + 2 * T * C);
      declare(*m, m->layer(l, "input_layernorm.weight"), {C}, st, TF_INIT_ONES, 0, no_decay);
      declare(*m, m->layer(l, "self_attn.q_proj.weight"), {C, C}, st, TF_INIT_NORMAL, std, 0);
      declare(*m, m->layer(l, "self_attn.k_proj.weight"), {KV, C}, st, TF_INIT_NORMAL, std, 0);
      declare(*m, m->layer(l, "self_attn.v_proj.weight"), {KV, C}, st, TF_INIT_NORMAL, std, 0);
      declare(*m, m->layer(l, "self_attn.o_proj.weight"), {C, C}, st, TF_INIT_NORMAL, proj_std, 0);
      declare(*m, m->layer(l, "post_attention_layernorm.weight"), {C}, st, TF_INIT_ONES, 0,
              no_decay);
      declare(*m, m->layer(l, "mlp.gate_proj.weight"), {I, C}, st, TF_INIT_NORMAL, std, 0);
      declare(*m, m->layer(l, "mlp.up_proj.weight"), {I, C}, st, TF_INIT_NORMAL, std, 0);
      declare(*m, m->layer(l, "mlp.down_proj.weight"), {C, I}, st, TF_INIT_NORMAL, proj_std, 0);
    }
    const int64_t loss = tf_sdk::loss_activation_bytes(V, elt);
    const int32_t head = m->host.declare_stage("head", TF_STAGE_HEAD, rms_norm_bytes + loss,
                                               2 * C * V, frozen_norm_bytes + loss, V * elt);
    declare(*m, "model.norm.weight", {C}, head, TF_INIT_ONES, 0, no_decay);
    if (!s.tie_embeddings) declare(*m, "lm_head.weight", {V, C}, head, TF_INIT_NORMAL, std, 0);
    nlohmann::json cfg = {
        {"model_type", "llama"},
        {"architectures", {"LlamaForCausalLM"}},
        {"vocab_size", V},
        {"hidden_size", C},
        {"intermediate_size", I},
        {"num_hidden_layers", L},
        {"num_attention_heads", s.n_head},
        {"num_key_value_heads", s.n_kv_head},
        {"head_dim", D},
        {"max_position_embeddings", s.max_positions},
        {"rope_theta", s.rope_theta},
        {"rms_norm_eps", s.rms_eps},
        {"tie_word_embeddings", s.tie_embeddings},
        {"hidden_act", "silu"},
        {"attention_bias", false},
        {"mlp_bias", false},
        {"rope_scaling", nullptr},
        {"torch_dtype", host.get_string("dtype") == "fp32" ? "float32" : "bfloat16"}};
    if (s.rope_scaling == "linear")
      cfg["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.rope_factor}};
    if (s.rope_scaling == "llama3")
      cfg["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", s.rope_factor},
                             {"low_freq_factor", s.rope_low_freq_factor},
                             {"high_freq_factor", s.rope_high_freq_factor},
                             {"original_max_position_embeddings", s.rope_original_max_positions}};
    m->hf_config = cfg.dump(2);
    host.log(TF_LOG_INFO,
             "LLaMA " + (config.empty() ? preset : config) + ": n_layer=" + std::to_string(L) +
                 " n_embd=" + std::to_string(C) + " n_head=" + std::to_string(s.n_head) +
                 " n_kv_head=" + std::to_string(s.n_kv_head) + " vocab=" + std::to_string(V));
    *out = m.release();
    return TF_OK;
  });
}

void destroy(void* state) {
  delete static_cast<Llama*>(state);
}

tf_status stage_forward(void* state, tf_host_context* ctx, const tf_stage_call* call,
                        tf_tensor input, tf_tensor* out) {
  auto* m = static_cast<Llama*>(state);
  return tf_sdk::guard(m->host.api(), ctx, [&] {
    const at::Tensor& x = tf_sdk::borrow(input);
    const int64_t last = m->s.n_layer + 1;
    at::Tensor y = call->stage == 0      ? m->embed(x)
                   : call->stage == last ? m->head(x)
                                         : m->block(x, call->stage - 1);
    *out = tf_sdk::give(std::move(y));
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("preset", TF_VALUE_STRING, "\"tiny\"",
                "model size: tiny (4x128, GQA 4:2), 1B (Llama-3.2-1B), 7B (Llama-2-7B), 13B "
                "(Llama-2-13B), 30B (LLaMA-30B), 70B (Llama-2-70B, GQA 64:8), custom",
                1, 0, "tiny|1B|7B|13B|30B|70B|custom"),
    tf_sdk::key("config", TF_VALUE_STRING, "\"\"",
                "Hugging Face config.json (or its folder) giving the shape"),
    tf_sdk::key("n_layer", TF_VALUE_INT, "0", "decoder layers (overrides)", 0, 1e4),
    tf_sdk::key("n_embd", TF_VALUE_INT, "0", "hidden size (overrides)", 0, 1e6),
    tf_sdk::key("n_head", TF_VALUE_INT, "0", "query heads (overrides)", 0, 1e4),
    tf_sdk::key("n_kv_head", TF_VALUE_INT, "0",
                "key/value heads, grouped-query attention (overrides)", 0, 1e4),
    tf_sdk::key("intermediate_size", TF_VALUE_INT, "0", "SwiGLU hidden size (overrides)", 0, 1e7),
    tf_sdk::key("vocab_size", TF_VALUE_INT, "0",
                "vocabulary; 0 = the preset's, else the tokenizer's", 0, 1e7),
    tf_sdk::key("max_positions", TF_VALUE_INT, "0", "longest sequence (overrides)", 0, 1e8),
    tf_sdk::key("rope_theta", TF_VALUE_FLOAT, "10000.0", "rotary base (overrides)", 1, 1e12),
    tf_sdk::key("rope_scaling", TF_VALUE_STRING, "\"none\"", "rotary scaling (overrides)", 1, 0,
                "none|linear|llama3"),
    tf_sdk::key("rope_factor", TF_VALUE_FLOAT, "1.0", "rotary scaling factor", 1e-6, 1e6),
    tf_sdk::key("rope_low_freq_factor", TF_VALUE_FLOAT, "1.0",
                "llama3 scaling: low-frequency factor", 1e-6, 1e6),
    tf_sdk::key("rope_high_freq_factor", TF_VALUE_FLOAT, "4.0",
                "llama3 scaling: high-frequency factor", 1e-6, 1e6),
    tf_sdk::key("rope_original_max_positions", TF_VALUE_INT, "8192",
                "llama3 scaling: original context", 1, 1e9),
    tf_sdk::key("rms_eps", TF_VALUE_FLOAT, "1e-5", "RMSNorm epsilon (overrides)", 0, 1),
    tf_sdk::key("tie_embeddings", TF_VALUE_BOOL, "false",
                "share the input embedding with the output head (overrides)"),
    tf_sdk::key("dtype", TF_VALUE_STRING, "\"fp32\"", "parameter dtype", 1, 0, "fp32|bf16|fp16"),
};

tf_status hf_config_json(void* state, tf_host_context*, const char** out) {
  *out = static_cast<Llama*>(state)->hf_config.c_str();
  return TF_OK;
}

const tf_model_vtable kVtable = {sizeof(tf_model_vtable), create,         destroy,
                                 stage_forward,           hf_config_json, {}};

const tf_plugin_descriptor kDescriptor =
    tf_sdk::describe(TF_PLUGIN_MODEL, "llama", "1.0.0",
                     "LLaMA 1/2/3: RMSNorm, rotary (linear/llama3 scaling), "
                     "SwiGLU, grouped-query attention; Hugging Face names",
                     kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
