// LLaMA-family decoders (Touvron et al. 2023; LLaMA-2, LLaMA-3, Mistral,
// Qwen2, Qwen3, Gemma 1/2/3, Phi-3) as one tightfit model plugin, with Hugging Face
// parameter names (LlamaForCausalLM and its kin).
//
//   h_0    = E[x]
//   a_l    = h_{l-1} + W_o Attn(RoPE(W_q u), RoPE(W_k u), W_v u),   u = RMSNorm_1(h_{l-1})
//   h_l    = a_l + W_down (silu(W_gate v) * W_up v),                 v = RMSNorm_2(a_l)
//   logits = RMSNorm_f(h_L) W_lm^T          (W_lm = E when embeddings are tied)
//
// Grouped-query attention: n_kv_head key/value heads, each shared by
// n_head / n_kv_head query heads. Rotary embeddings with the theta and the
// scaling (linear, dynamic, llama3, yarn) a config gives. The families differ
// only in small terms, each flagged in the shape:
//   Qwen2   q, k, v carry biases (b_q, b_k, b_v); untied head
//   Qwen3   q and k RMS-normalized per head before rotary; head_dim != C/H
//   Mistral each query sees the sliding_window latest keys
//   LLaMA   attention_bias (q, k, v, o) and mlp_bias (gate, up, down) when set
//   Gemma   h_0 = sqrt(C) E[x]; RMSNorm(x) = x / rms(x) * (1 + w) in fp32;
//           GeGLU (gelu_pytorch_tanh); head_dim 256 unless given; tied head
//   Gemma 2 Gemma, and: scores q k^T / sqrt(query_pre_attn_scalar), capped
//           as c tanh(s / c) before the mask; every sub-layer's output normed
//           before its residual add,
//             a_l = h + RMSNorm_pa(Attn(RMSNorm_1(h)))
//             h_l = a_l + RMSNorm_pf(MLP(RMSNorm_f1(a_l)));
//           alternate layers slide; logits capped as c_f tanh(z / c_f)
//   Gemma 3 Gemma 2 without the attention cap (the final one optional), and:
//           q and k (1 + w)-RMS-normalized per head before rotary; the
//           sliding layers (five in six by default) rotate by their own base
//           rope_local_base_freq, unscaled, the full ones by rope_theta
//           with rope_scaling
//   Phi-3   [q k v] = W_qkv u and [g u'] = W_gate_up v, each one projection;
//           rotary on the first partial_rotary_factor of each head's
//           dimensions; LongRoPE (short or long factors by the pass's
//           furthest position); every layer slides when sliding_window is set
#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "decoder_shape.hpp"
#include "rope.hpp"
#include "tightfit/activation_bytes.hpp"
#include "tightfit/packed_rows.hpp"
#include "tightfit/plugin_sdk.hpp"

namespace {

using llama::Shape;

// Keys and values of every position decoded so far, per layer ([B, KVH, S, D],
// before grouped heads are repeated), for incremental generation.
struct KvCache {
  std::vector<at::Tensor> k, v;
  int64_t length = 0;
};

struct Llama {
  tf_sdk::Host host;
  Shape s;
  at::ScalarType dtype = at::kFloat;
  llama::Rope rotary;     // inverse frequencies on the run's device, attention scaling
  llama::Rope local;      // Gemma 3's sliding layers' (Shape::local_rope)
  std::string hf_config;  // config.json for export

  int64_t head_dim() const { return s.d_head(); }
  std::string layer(int64_t l, const char* rest) const {
    return "model.layers." + std::to_string(l) + "." + rest;
  }
  // A projection y = W x (+ b when the family has that bias).
  at::Tensor proj(const at::Tensor& x, int64_t l, const char* name, bool biased) const {
    const std::string w = layer(l, name);
    return host.linear(x, w + ".weight", biased ? w + ".bias" : std::string());
  }

  at::Tensor rms_norm(const at::Tensor& x, const std::string& weight) const {
    // In fp32, as the reference does, then back to the activations' dtype.
    at::Tensor xf = x.to(at::kFloat);
    xf = xf * at::rsqrt(xf.pow(2).mean(-1, true) + s.rms_eps);
    // Gemma scales before the cast, by 1 + w (its weights start at zero).
    if (s.unit_offset_norm)
      return (xf * (1.0 + host.weight(weight).to(at::kFloat))).to(x.scalar_type());
    return host.weight(weight) * xf.to(x.scalar_type());
  }

  at::Tensor act(const at::Tensor& x) const {
    if (s.act == "silu" || s.act == "swish") return at::silu(x);
    if (s.act == "gelu") return at::gelu(x);
    if (s.act == "relu") return at::relu(x);
    return at::gelu(x, "tanh");  // gelu_new, gelu_pytorch_tanh
  }

  // x: [B, heads, T, D]; rotate pairs (i, i + R/2) of the first R = cos's
  // size dimensions by position * inv_freq (R < D: Phi-3's partial rotary).
  at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const {
    const int64_t R = cos.size(-1);
    if (R < x.size(-1)) return at::cat({rope(x.slice(-1, 0, R), cos, sin), x.slice(-1, R)}, -1);
    const int64_t half = R / 2;
    at::Tensor rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
    return x * cos + rotated * sin;
  }

  // The keys each query may see: T queries at positions pos0.. over S keys
  // at 0..S-1 (S = pos0 + T), causal; with a window W, the query at t sees
  // keys t-W+1 .. t. Packed rows (`positions` given) keep each query inside
  // its own example. Bool [T, S] or [B, 1, T, S].
  at::Tensor allowed_keys(int64_t T, int64_t S, int64_t pos0, bool window,
                          const at::Tensor& positions, const at::Device& device) const {
    if (positions.defined())
      return tf_sdk::packed_causal_mask(positions, window ? s.sliding_window : 0);
    return tf_sdk::causal_mask(T, S, pos0, window ? s.sliding_window : 0, device);
  }

  // Attention of q [B, H, T, D] over k, v [B, H, S, D] in layer l.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t l,
                    int64_t pos0, const at::Tensor& positions) const {
    const int64_t T = q.size(2), S = k.size(2);
    const bool window = s.windowed(l) && s.sliding_window < S;
    const std::optional<double> scale =
        s.query_pre_attn_scalar > 0
            ? std::optional<double>(1.0 / std::sqrt(s.query_pre_attn_scalar))
            : std::nullopt;
    if (s.attn_softcap > 0) {  // Gemma 2: scores capped before the mask, spelled out
      at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) *
                          scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
      scores = at::tanh(scores / s.attn_softcap) * s.attn_softcap;
      scores =
          scores.masked_fill(allowed_keys(T, S, pos0, window, positions, q.device()).logical_not(),
                             -std::numeric_limits<double>::infinity());
      return at::matmul(at::softmax(scores, -1, at::kFloat).to(q.scalar_type()), v);
    }
    if (!positions.defined() && pos0 == 0 && !window)
      return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale);
    if (!positions.defined() && T == 1 && !window)  // one new query sees every key
      return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/false, scale);
    return at::scaled_dot_product_attention(
        q, k, v, allowed_keys(T, S, pos0, window, positions, q.device()), 0.0,
        /*is_causal=*/false, scale);
  }

  // `cache`: null in training; in decoding, the keys and values so far
  // (this call's are appended), the new tokens starting at cache->length.
  // `positions` [B, T]: packed rows' own positions; undefined = 0..T-1.
  at::Tensor attention(const at::Tensor& u, int64_t l, KvCache* cache,
                       const at::Tensor& positions) const {
    const int64_t B = u.size(0), T = u.size(1), H = s.n_head, KVH = s.n_kv_head, D = head_dim();
    at::Tensor q, k, v;
    if (s.fused_projections) {  // Phi-3: rows q, then k, then v
      const at::Tensor qkv = proj(u, l, "self_attn.qkv_proj", false);
      q = qkv.narrow(-1, 0, H * D), k = qkv.narrow(-1, H * D, KVH * D);
      v = qkv.narrow(-1, (H + KVH) * D, KVH * D);
    } else {
      q = proj(u, l, "self_attn.q_proj", s.qkv_bias);
      k = proj(u, l, "self_attn.k_proj", s.qkv_bias);
      v = proj(u, l, "self_attn.v_proj", s.qkv_bias);
    }
    q = q.reshape({B, T, H, D});
    k = k.reshape({B, T, KVH, D});
    v = v.reshape({B, T, KVH, D}).transpose(1, 2);
    if (s.qk_norm) {  // Qwen3, Gemma 3: RMSNorm over each head's D values
      q = rms_norm(q, layer(l, "self_attn.q_norm.weight"));
      k = rms_norm(k, layer(l, "self_attn.k_norm.weight"));
    }
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
    const int64_t pos0 = cache ? cache->length : 0;
    const at::Tensor pos = positions.defined()  // [B, 1, T] or [T]
                               ? positions.unsqueeze(1).to(at::kFloat)
                               : at::arange(pos0, pos0 + T, at::kFloat);
    const llama::Rope& r = s.local_rope(l) ? local : rotary;
    const at::Tensor angles = pos.to(r.inv_freq.device()).unsqueeze(-1) *
                              inv_freq(r, positions, pos0 + T);  // [.., T, R/2]
    at::Tensor emb = at::cat({angles, angles}, -1);
    at::Tensor cos = emb.cos(), sin = emb.sin();
    if (r.attention_scaling != 1.0) {
      cos = cos * r.attention_scaling;
      sin = sin * r.attention_scaling;
    }
    cos = cos.to(q.scalar_type()), sin = sin.to(q.scalar_type());
    q = rope(q, cos, sin);
    k = rope(k, cos, sin);
    if (cache) {
      auto& ck = cache->k[static_cast<size_t>(l)];
      auto& cv = cache->v[static_cast<size_t>(l)];
      ck = ck.defined() ? at::cat({ck, k}, 2) : k;
      cv = cv.defined() ? at::cat({cv, v}, 2) : v;
      k = ck, v = cv;
    }
    if (KVH != H) {  // each key/value head serves H / KVH query heads
      k = k.repeat_interleave(H / KVH, 1);
      v = v.repeat_interleave(H / KVH, 1);
    }
    at::Tensor y = attend(q, k, v, l, pos0, positions);
    return proj(y.transpose(1, 2).reshape({B, T, H * D}), l, "self_attn.o_proj", s.o_bias);
  }

  // LongRoPE's long frequencies when the pass reaches past the original
  // context (its furthest position + 1, as transformers decides per call).
  static const at::Tensor& inv_freq(const llama::Rope& r, const at::Tensor& positions,
                                    int64_t end) {
    if (!r.inv_freq_long.defined()) return r.inv_freq;
    const int64_t furthest = positions.defined() ? positions.max().item<int64_t>() + 1 : end;
    return furthest > r.long_after ? r.inv_freq_long : r.inv_freq;
  }

  at::Tensor mlp(const at::Tensor& v, int64_t l) const {
    if (s.fused_projections) {  // Phi-3: gate's rows, then up's
      const at::Tensor gate_up = proj(v, l, "mlp.gate_up_proj", false);
      const at::Tensor up = gate_up.narrow(-1, s.intermediate, s.intermediate);
      return proj(up * act(gate_up.narrow(-1, 0, s.intermediate)), l, "mlp.down_proj", false);
    }
    at::Tensor gate = act(proj(v, l, "mlp.gate_proj", s.mlp_bias));
    return proj(gate * proj(v, l, "mlp.up_proj", s.mlp_bias), l, "mlp.down_proj", s.mlp_bias);
  }

  at::Tensor block(const at::Tensor& h, int64_t l, KvCache* cache,
                   const at::Tensor& positions = {}) const {
    const at::Tensor y =
        attention(rms_norm(h, layer(l, "input_layernorm.weight")), l, cache, positions);
    if (s.sandwich_norms) {  // Gemma 2
      const at::Tensor a = h + rms_norm(y, layer(l, "post_attention_layernorm.weight"));
      const at::Tensor m = mlp(rms_norm(a, layer(l, "pre_feedforward_layernorm.weight")), l);
      return a + rms_norm(m, layer(l, "post_feedforward_layernorm.weight"));
    }
    const at::Tensor a = h + y;
    return a + mlp(rms_norm(a, layer(l, "post_attention_layernorm.weight")), l);
  }

  at::Tensor embed(const at::Tensor& tokens) const {
    TORCH_CHECK(tokens.size(1) <= s.max_positions, "sequence of ", tokens.size(1),
                " tokens is longer than max_positions = ", s.max_positions);
    // Tied, E is also the head, whose dense gradient reaches it first: the
    // lookup's sparse gradient adds its rows into it (no second [V, C] tensor).
    // Untied, the lookup's gradient is E's whole gradient and stays dense.
    const at::Tensor e =
        at::embedding(host.weight("model.embed_tokens.weight"), tokens, s.pad_token_id, false,
                      /*sparse=*/s.tie_embeddings);
    if (!s.scaled_embeddings) return e;
    // Gemma: sqrt(C) rounded to the activations' dtype first, as transformers.
    return e * at::scalar_tensor(std::sqrt(static_cast<double>(s.n_embd)), e.options());
  }

  const char* head_weight() const {
    return s.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  }
  // The logits, or (hidden_only) the hidden state the host projects itself
  // (and caps, Gemma 2's head declaring its cap: ABI 1.14).
  at::Tensor head(const at::Tensor& h, bool hidden_only = false) const {
    const at::Tensor hidden = rms_norm(h, "model.norm.weight");
    if (hidden_only) return hidden;
    const at::Tensor logits = host.linear(hidden, head_weight());
    if (s.final_softcap <= 0) return logits;
    return at::tanh(logits / s.final_softcap) * s.final_softcap;  // Gemma 2
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
      m->s = llama::shape_from_hf_config(config);
    } else {
      bool found = preset == "custom";
      for (const auto& p : llama::presets())
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
    if (host.has("head_dim")) s.head_dim = host.get_int("head_dim");
    if (s.n_kv_head == 0) s.n_kv_head = s.n_head;
    if (s.vocab == 0) s.vocab = info.vocab_size;
    if (s.sliding_window > 0)  // an n_layer override keeps the config's pattern
      s.sliding_layers.resize(static_cast<size_t>(std::max<int64_t>(s.n_layer, 0)),
                              s.sliding_layers.empty() ? true : s.sliding_layers.back());
    llama::validate(s, config.empty() ? "[model]" : config);
    if (s.vocab < info.vocab_size)
      throw std::invalid_argument("vocab_size = " + std::to_string(s.vocab) +
                                  " is smaller than the tokenizer's " +
                                  std::to_string(info.vocab_size));
    if (info.seq_len > s.max_positions)
      throw std::invalid_argument("[data] seq_len exceeds max_positions = " +
                                  std::to_string(s.max_positions));
    m->dtype = tf_sdk::scalar_type(tf_sdk::parse_dtype(host.get_string("dtype")));
    m->rotary = llama::make_rope(s);
    if (s.rope_local_theta > 0) {  // Gemma 3's sliding layers: their base, no scaling
      Shape local = s;
      local.rope_theta = s.rope_local_theta;
      local.rope_scaling = "none";
      m->local = llama::make_rope(local);
    }
    if (!tf_sdk::planning_only(info))
      for (llama::Rope* r : {&m->rotary, &m->local})
        for (at::Tensor* f : {&r->inv_freq, &r->inv_freq_long})
          if (f->defined()) *f = f->to(at::Device(info.device));

    const int64_t L = s.n_layer, C = s.n_embd, V = s.vocab, D = m->head_dim(), I = s.intermediate;
    const int64_t KV = s.n_kv_head * D, Q = s.n_head * D, T = info.seq_len;
    const int64_t elt = m->dtype == at::kFloat ? 4 : 2;
    const uint32_t no_decay = TF_PARAM_NO_WEIGHT_DECAY;
    // A norm's identity: w = 1, or Gemma's w = 0 (it scales by 1 + w).
    const tf_init_kind norm_init = s.unit_offset_norm ? TF_INIT_ZEROS : TF_INIT_ONES;
    const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));

    // Activation bytes per token autograd keeps (for `plan`). RMSNorm keeps
    // its fp32 input (a copy unless the activations are fp32), the normalized
    // value and the scaled output (the projections' input); attention keeps
    // rotated q, k and v as attention sees them (repeated for grouped
    // heads: H D each) and its output (H D), Qwen3's per-head norms their
    // fp32 inputs; the MLP its input's gate, up, silu(gate)
    // and their product (4 I). Small fp32 statistics round it off.
    // Frozen, a norm keeps only its fp32 input and the MLP gate's input, silu
    // of it and up (3 I): the linears' inputs and the norms' outputs go.
    const int64_t rms_norm_bytes = 4 * C + 2 * elt * C, frozen_norm_bytes = 4 * C;
    // Gemma 2's capped attention keeps its [T, T] scores per head: their tanh
    // and the probabilities (fp32; measured), and two norms more.
    const int64_t n_norms = s.sandwich_norms ? 4 : 2;
    const int64_t extra = 72 + tf_sdk::attention_lse_bytes(s.n_head) +
                          (s.qk_norm ? 4 * (Q + KV) + 2 * elt * (Q + KV) : 0) +
                          (s.attn_softcap > 0 ? 2 * 4 * s.n_head * T : 0);
    const int64_t block_bytes = n_norms * rms_norm_bytes + 4 * elt * Q + 4 * elt * I + extra;
    const int64_t frozen_block_bytes =
        n_norms * frozen_norm_bytes + 4 * elt * Q + 3 * elt * I + extra;
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
          2 * (2 * C * Q + 2 * C * KV + 3 * C * I) + 2 * T * Q);
      declare(*m, m->layer(l, "input_layernorm.weight"), {C}, st, norm_init, 0, no_decay);
      if (s.fused_projections) {
        declare(*m, m->layer(l, "self_attn.qkv_proj.weight"), {Q + 2 * KV, C}, st, TF_INIT_NORMAL,
                std, 0);
      } else {
        declare(*m, m->layer(l, "self_attn.q_proj.weight"), {Q, C}, st, TF_INIT_NORMAL, std, 0);
        declare(*m, m->layer(l, "self_attn.k_proj.weight"), {KV, C}, st, TF_INIT_NORMAL, std, 0);
        declare(*m, m->layer(l, "self_attn.v_proj.weight"), {KV, C}, st, TF_INIT_NORMAL, std, 0);
      }
      if (s.qkv_bias) {
        declare(*m, m->layer(l, "self_attn.q_proj.bias"), {Q}, st, TF_INIT_ZEROS, 0, no_decay);
        declare(*m, m->layer(l, "self_attn.k_proj.bias"), {KV}, st, TF_INIT_ZEROS, 0, no_decay);
        declare(*m, m->layer(l, "self_attn.v_proj.bias"), {KV}, st, TF_INIT_ZEROS, 0, no_decay);
      }
      if (s.qk_norm) {
        declare(*m, m->layer(l, "self_attn.q_norm.weight"), {D}, st, norm_init, 0, no_decay);
        declare(*m, m->layer(l, "self_attn.k_norm.weight"), {D}, st, norm_init, 0, no_decay);
      }
      declare(*m, m->layer(l, "self_attn.o_proj.weight"), {C, Q}, st, TF_INIT_NORMAL, proj_std, 0);
      if (s.o_bias)
        declare(*m, m->layer(l, "self_attn.o_proj.bias"), {C}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->layer(l, "post_attention_layernorm.weight"), {C}, st, norm_init, 0, no_decay);
      if (s.sandwich_norms)
        for (const char* norm :
             {"pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"})
          declare(*m, m->layer(l, norm), {C}, st, norm_init, 0, no_decay);
      if (s.fused_projections) {
        declare(*m, m->layer(l, "mlp.gate_up_proj.weight"), {2 * I, C}, st, TF_INIT_NORMAL, std, 0);
      } else {
        declare(*m, m->layer(l, "mlp.gate_proj.weight"), {I, C}, st, TF_INIT_NORMAL, std, 0);
        declare(*m, m->layer(l, "mlp.up_proj.weight"), {I, C}, st, TF_INIT_NORMAL, std, 0);
      }
      declare(*m, m->layer(l, "mlp.down_proj.weight"), {C, I}, st, TF_INIT_NORMAL, proj_std, 0);
      if (s.mlp_bias) {
        declare(*m, m->layer(l, "mlp.gate_proj.bias"), {I}, st, TF_INIT_ZEROS, 0, no_decay);
        declare(*m, m->layer(l, "mlp.up_proj.bias"), {I}, st, TF_INIT_ZEROS, 0, no_decay);
        declare(*m, m->layer(l, "mlp.down_proj.bias"), {C}, st, TF_INIT_ZEROS, 0, no_decay);
      }
    }
    const int64_t loss = tf_sdk::loss_activation_bytes(V, elt);
    const int32_t head = m->host.declare_stage(
        "head", TF_STAGE_HEAD, {rms_norm_bytes + loss, frozen_norm_bytes + loss, V * elt},
        2 * C * V, {m->head_weight(), "", loss, s.final_softcap});
    declare(*m, "model.norm.weight", {C}, head, norm_init, 0, no_decay);
    if (!s.tie_embeddings) declare(*m, "lm_head.weight", {V, C}, head, TF_INIT_NORMAL, std, 0);
    const nlohmann::json cfg = llama::hf_config_for_export(s, host.get_string("dtype"));
    m->hf_config = cfg.dump(2);
    host.log(TF_LOG_INFO, s.model_type + " " + (config.empty() ? preset : config) +
                              ": n_layer=" + std::to_string(L) + " n_embd=" + std::to_string(C) +
                              " n_head=" + std::to_string(s.n_head) + " n_kv_head=" +
                              std::to_string(s.n_kv_head) + " vocab=" + std::to_string(V));
    *out = m.release();
    return TF_OK;
  });
}

tf_status stage_forward(void* state, tf_host_context* ctx, const tf_stage_call* call,
                        tf_tensor input, tf_tensor* out) {
  auto* m = static_cast<Llama*>(state);
  return tf_sdk::guard(m->host.api(), ctx, [&] {
    const at::Tensor& x = tf_sdk::borrow(input);
    const int64_t last = m->s.n_layer + 1;
    at::Tensor y = call->stage == 0 ? m->embed(x)
                   : call->stage == last
                       ? m->head(x, tf_sdk::head_hidden_only(call))
                       : m->block(x, call->stage - 1, nullptr, tf_sdk::call_positions(call));
    *out = tf_sdk::give(std::move(y));
    return TF_OK;
  });
}

// Incremental decoding: the new tokens attend to the cached keys and values.
tf_status decode(void* state, tf_host_context* ctx, void** cache, tf_tensor tokens,
                 tf_tensor* out) {
  auto* m = static_cast<Llama*>(state);
  return tf_sdk::guard(m->host.api(), ctx, [&] {
    if (*cache == nullptr) {
      auto* c = new KvCache();
      c->k.resize(static_cast<size_t>(m->s.n_layer));
      c->v.resize(static_cast<size_t>(m->s.n_layer));
      *cache = c;
    }
    auto& c = *static_cast<KvCache*>(*cache);
    const at::Tensor& x = tf_sdk::borrow(tokens);
    if (c.length + x.size(1) > m->s.max_positions)
      throw std::invalid_argument(
          "generation reached max_positions = " + std::to_string(m->s.max_positions) +
          " tokens (prompt and new tokens together)");
    at::Tensor h = m->embed(x);  // Gemma's scaling too
    for (int64_t l = 0; l < m->s.n_layer; ++l) h = m->block(h, l, &c);
    c.length += x.size(1);
    *out = tf_sdk::give(m->head(h));
    return TF_OK;
  });
}

void release_cache(void*, void* cache) {
  delete static_cast<KvCache*>(cache);
}

const tf_config_key kKeys[] = {
    tf_sdk::key("preset", TF_VALUE_STRING, "\"tiny\"",
                "model size: tiny (4x128, GQA 4:2), 1B (Llama-3.2-1B), 7B (Llama-2-7B), 13B "
                "(Llama-2-13B), 30B (LLaMA-30B), 70B (Llama-2-70B, GQA 64:8), qwen2-1.5B "
                "(DeepSeek-R1-Distill-Qwen-1.5B's shape), custom",
                1, 0, "tiny|1B|7B|13B|30B|70B|qwen2-1.5B|custom"),
    tf_sdk::key("config", TF_VALUE_PATH, "\"\"",
                "Hugging Face config.json (or its folder) giving the shape; model_type llama, "
                "mistral, qwen2, qwen3, gemma, gemma2, gemma3_text or phi3"),
    tf_sdk::key("n_layer", TF_VALUE_INT, "0", "decoder layers (overrides)", 0, 1e4),
    tf_sdk::key("n_embd", TF_VALUE_INT, "0", "hidden size (overrides)", 0, 1e6),
    tf_sdk::key("n_head", TF_VALUE_INT, "0", "query heads (overrides)", 0, 1e4),
    tf_sdk::key("head_dim", TF_VALUE_INT, "0", "per-head size; 0 = n_embd / n_head (overrides)", 0,
                1e5),
    tf_sdk::key("n_kv_head", TF_VALUE_INT, "0",
                "key/value heads, grouped-query attention (overrides)", 0, 1e4),
    tf_sdk::key("intermediate_size", TF_VALUE_INT, "0", "SwiGLU hidden size (overrides)", 0, 1e7),
    tf_sdk::key("vocab_size", TF_VALUE_INT, "0",
                "vocabulary; 0 = the preset's, else the tokenizer's", 0, 1e7),
    tf_sdk::key("max_positions", TF_VALUE_INT, "0", "longest sequence (overrides)", 0, 1e8),
    tf_sdk::key("rope_theta", TF_VALUE_FLOAT, "10000.0", "rotary base (overrides)", 1, 1e12),
    tf_sdk::key("rope_scaling", TF_VALUE_STRING, "\"none\"", "rotary scaling (overrides)", 1, 0,
                "none|linear|dynamic|llama3|yarn"),
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

const tf_model_vtable kVtable = {.struct_size = sizeof(tf_model_vtable),
                                 .create = create,
                                 .destroy = tf_sdk::destroy_state<Llama>,
                                 .stage_forward = stage_forward,
                                 .hf_config_json = hf_config_json,
                                 .decode = decode,
                                 .release_cache = release_cache,
                                 .hf_model_types = llama::kModelTypes,
                                 .features = TF_MODEL_FEATURE_POSITIONS};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_MODEL, "llama", "1.0.0",
    "LLaMA 1/2/3, Mistral, Qwen2, Qwen3, Gemma 1/2/3, Phi-3 decoders: RMSNorm, rotary "
    "(linear/dynamic/llama3/yarn/longrope), SwiGLU, grouped-query and sliding-window "
    "attention; Hugging Face names",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
