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
//   Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE: the MLP is a mixture of experts,
//             p = softmax(W_router v),   y = sum_{e in topk(p)} p_e MLP_e(v)
//           (p renormalized over the top k: Mixtral, norm_topk_prob);
//           Qwen2-MoE adds sigmoid(w_s v) MLP_shared(v) and keeps dense MLPs
//           off decoder_sparse_step and in mlp_only_layers; Qwen3-MoE has
//           Qwen3's q/k norms; OLMoE RMS-normalizes q and k over all heads
//           (before splitting them) and clamps q, k, v to clip_qkv
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <array>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "decoder_shape.hpp"
#include "experts.hpp"
#include "rope.hpp"
#include "router_balance.hpp"
#include "tightfit/activation_bytes.hpp"
#include "tightfit/packed_rows.hpp"
#include "tightfit/plugin_sdk.hpp"
#include "tightfit/rms_norm.hpp"
#include "tightfit/tiled_attention.hpp"

namespace llama {

// Keys and values of every position decoded so far, per layer ([B, KVH, S, D],
// before grouped heads are repeated), for incremental generation. Rows that
// begin at different columns (decode_rows: left-padded prompts) keep their
// starts, and each call's positions and the keys each query may see.
struct KvCache {
  std::vector<at::Tensor> k, v;
  int64_t length = 0;
  at::Tensor starts;             // int64 [B]: each row's first real column; undefined: all 0
  at::Tensor positions;          // this call's [B, T], counted from each row's start
  at::Tensor keys, window_keys;  // this call's bool [B, 1, T, S] (window_keys: windowed layers)
};

struct Llama {
  tf_sdk::Host host;
  Shape s;
  at::ScalarType dtype = at::kFloat;
  Rope rotary;            // inverse frequencies on the run's device, attention scaling
  Rope local;             // Gemma 3's sliding layers' (Shape::local_rope)
  std::string hf_config;  // config.json for export
  bool tiled_mlp =
      false;  // [run] mlp_tile_tokens > 0: dense feed-forwards through tiled_over_tokens

  int64_t head_dim() const { return s.d_head(); }
  std::string layer(int64_t l, const char* rest) const {
    return "model.layers." + std::to_string(l) + "." + rest;
  }
  // A projection y = W x (+ b when the family has that bias).
  at::Tensor proj(const at::Tensor& x, int64_t l, const char* name, bool biased) const {
    const std::string w = layer(l, name);
    return host.linear(x, w + ".weight", biased ? w + ".bias" : std::string());
  }

  // (A cast to the dtype a tensor has is an op all the same: skipped.)
  static at::Tensor as(const at::Tensor& x, at::ScalarType dtype) {
    return x.scalar_type() == dtype ? x : x.to(dtype);
  }

  // In fp32, as the reference does, then back to the activations' dtype;
  // Gemma scales before the cast, by 1 + w (its weights start at zero). A
  // 16-bit input is kept for backward as it is (tightfit/rms_norm.hpp).
  at::Tensor rms_norm(const at::Tensor& x, const std::string& weight) const {
    return tf_sdk::rms_norm(x, host.weight(weight), s.rms_eps, s.unit_offset_norm);
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
    const std::vector<at::Tensor> halves = x.chunk(2, -1);  // one op, and one in backward
    const at::Tensor rotated = at::cat({-halves[1], halves[0]}, -1);
    return x * cos + rotated * sin;
  }

  // cos and sin of the rotary angles ([.., T, R], the attention scaling
  // applied, in `dtype`), made once a pass: every layer of it asks for the
  // same ones (a checkpointed layer's recompute too).
  struct RotaryTables {
    const at::Tensor* inv_freq = nullptr;
    at::Tensor positions;  // held, so that no other tensor takes its place
    int64_t version = 0, pos0 = -1, T = -1;
    at::ScalarType dtype = at::kFloat;
    at::Tensor cos, sin;
  };
  mutable RotaryTables rotary_tables_[2];  // the rotary's, and the local one's
  std::pair<at::Tensor, at::Tensor> rotary_cos_sin(bool local_rope, const at::Tensor& positions,
                                                   int64_t pos0, int64_t T,
                                                   at::ScalarType dtype) const {
    const Rope& r = local_rope ? local : rotary;
    const at::Tensor& freqs = inv_freq(r, positions, pos0 + T);
    RotaryTables& c = rotary_tables_[local_rope ? 1 : 0];
    const bool same =
        c.inv_freq == &freqs && c.dtype == dtype && c.pos0 == pos0 && c.T == T &&
        (positions.defined() ? c.positions.is_same(positions) && c.version == positions._version()
                             : !c.positions.defined());
    if (same) return {c.cos, c.sin};
    const at::Tensor pos = positions.defined()  // [B, 1, T] or [T]
                               ? positions.unsqueeze(1).to(at::kFloat)
                               : at::arange(pos0, pos0 + T, at::kFloat);
    const at::Tensor angles = pos.to(freqs.device()).unsqueeze(-1) * freqs;  // [.., T, R/2]
    const at::Tensor emb = at::cat({angles, angles}, -1);
    at::Tensor cos = emb.cos(), sin = emb.sin();
    if (r.attention_scaling != 1.0) {
      cos = cos * r.attention_scaling;
      sin = sin * r.attention_scaling;
    }
    c = {&freqs,
         positions,
         positions.defined() ? positions._version() : 0,
         pos0,
         T,
         dtype,
         as(cos, dtype),
         as(sin, dtype)};
    return {c.cos, c.sin};
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

  // Whether LibTorch's attention serves grouped key/value heads itself for
  // this query: on the CPU always; on CUDA in 16 bits without a mask, where
  // its flash and cuDNN kernels read each key/value head for its group (in
  // fp32, or with a mask, the memory-efficient kernel runs, which some
  // builds give only equal heads, and a kernel refused for them falls to
  // the math one, quadratic in T).
  static bool kernel_serves_grouped_heads(const at::Tensor& q, bool masked) {
    if (q.device().is_cpu()) return true;
    if (!q.device().is_cuda() || masked) return false;
    const at::ScalarType seen = at::autocast::is_autocast_enabled(at::kCUDA)
                                    ? at::autocast::get_autocast_dtype(at::kCUDA)
                                    : q.scalar_type();
    return seen == at::kBFloat16 || seen == at::kHalf;
  }

  // Attention of q [B, H, T, D] over k, v [B, KVH, S, D] in layer l: each
  // key/value head serves H / KVH query heads.
  // `keys` (bool, broadcast to [B, 1, T, S]) says which keys each query sees
  // where rows begin at different columns; undefined: from pos0 and positions.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in, int64_t l,
                    int64_t pos0, const at::Tensor& positions, const at::Tensor& keys = {}) const {
    const int64_t T = q.size(2), S = k_in.size(2), groups = q.size(1) / k_in.size(1);
    const bool window = s.windowed(l) && s.sliding_window < S;
    const std::optional<double> scale =
        s.query_pre_attn_scalar > 0
            ? std::optional<double>(1.0 / std::sqrt(s.query_pre_attn_scalar))
            : std::nullopt;
    // A long pass whose attention needs a mask (a window, packed rows) or
    // capped scores: in tiles, linear in T (plain causal attention is, as
    // LibTorch computes it).
    if (!keys.defined() && pos0 == 0 && S == T && T >= tf_sdk::kTiledAttentionFrom &&
        (s.masked_or_capped(l, S) || positions.defined()))
      return tf_sdk::tiled_attention(
          q, k_in, v_in,
          {scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1)))), s.attn_softcap,
           window ? s.sliding_window : 0, positions, tf_sdk::kTiledAttentionTile});
    // Grouped heads go to the kernel as they are (enable_gqa: the same
    // values and gradients, two copies and their backward fewer) where it
    // serves them itself; elsewhere, and for the spelled-out softcap, the
    // heads are repeated.
    const bool causal = !keys.defined() && !positions.defined() && pos0 == 0 && !window;
    const bool one_query = !keys.defined() && !positions.defined() && T == 1 && !window;
    const bool grouped = groups > 1 && s.attn_softcap <= 0 &&
                         kernel_serves_grouped_heads(q, /*masked=*/!causal && !one_query);
    at::Tensor k = k_in, v = v_in;
    if (groups > 1 && !grouped) {
      k = k.repeat_interleave(groups, 1);
      v = v.repeat_interleave(groups, 1);
    }
    if (s.attn_softcap > 0) {  // Gemma 2: scores capped before the mask, spelled out
      at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) *
                          scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
      scores = at::tanh(scores / s.attn_softcap) * s.attn_softcap;
      scores = scores.masked_fill(
          (keys.defined() ? keys : allowed_keys(T, S, pos0, window, positions, q.device()))
              .logical_not(),
          -std::numeric_limits<double>::infinity());
      return at::matmul(at::softmax(scores, -1, at::kFloat).to(q.scalar_type()), v);
    }
    if (keys.defined())
      return at::scaled_dot_product_attention(q, k, v, keys, 0.0, /*is_causal=*/false, scale,
                                              grouped);
    if (causal)
      return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale, grouped);
    if (one_query)  // one new query sees every key
      return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/false, scale,
                                              grouped);
    return at::scaled_dot_product_attention(
        q, k, v, allowed_keys(T, S, pos0, window, positions, q.device()), 0.0,
        /*is_causal=*/false, scale, grouped);
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
    if (s.qk_norm_full) {  // OLMoE: over all heads at once
      q = rms_norm(q, layer(l, "self_attn.q_norm.weight"));
      k = rms_norm(k, layer(l, "self_attn.k_norm.weight"));
    }
    if (s.clip_qkv > 0) {
      q = q.clamp(-s.clip_qkv, s.clip_qkv);
      k = k.clamp(-s.clip_qkv, s.clip_qkv);
      v = v.clamp(-s.clip_qkv, s.clip_qkv);
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
    const bool rows_start_apart = cache != nullptr && cache->starts.defined();
    const at::Tensor& at_positions = rows_start_apart ? cache->positions : positions;
    const auto [cos, sin] = rotary_cos_sin(s.local_rope(l), at_positions, pos0, T, q.scalar_type());
    q = rope(q, cos, sin);
    k = rope(k, cos, sin);
    if (cache) {
      auto& ck = cache->k[static_cast<size_t>(l)];
      auto& cv = cache->v[static_cast<size_t>(l)];
      ck = ck.defined() ? at::cat({ck, k}, 2) : k;
      cv = cv.defined() ? at::cat({cv, v}, 2) : v;
      k = ck, v = cv;
    }
    at::Tensor y = rows_start_apart ? attend(q, k, v, l, pos0, {},
                                             s.windowed(l) ? cache->window_keys : cache->keys)
                                    : attend(q, k, v, l, pos0, positions);
    return proj(y.transpose(1, 2).reshape({B, T, H * D}), l, "self_attn.o_proj", s.o_bias);
  }

  // LongRoPE's long frequencies when the pass reaches past the original
  // context (its furthest position + 1, as transformers decides per call).
  const at::Tensor& inv_freq(const Rope& r, const at::Tensor& positions, int64_t end) const {
    if (!r.inv_freq_long.defined()) return r.inv_freq;
    const int64_t furthest = positions.defined() ? furthest_position(positions) + 1 : end;
    return furthest > r.long_after ? r.inv_freq_long : r.inv_freq;
  }
  // positions.max(), a device sync on a GPU, taken once a pass: every block
  // of the pass gets the same positions tensor, unchanged (its version).
  int64_t furthest_position(const at::Tensor& positions) const {
    if (!furthest_of_.positions.is_same(positions) ||
        furthest_of_.version != positions._version()) {
      furthest_of_.positions = positions;
      furthest_of_.version = positions._version();
      furthest_of_.value = positions.max().item<int64_t>();
    }
    return furthest_of_.value;
  }
  struct FurthestPosition {
    at::Tensor positions;  // held, so that no other tensor takes its place
    int64_t version = 0;
    int64_t value = 0;
  };
  mutable FurthestPosition furthest_of_;

  // The routers' load-balancing loss (Shape::router_aux_coef > 0), and what
  // a stage of a pass tells it while the stage runs (none in decode).
  struct PassCall {
    at::Tensor attention_mask;  // [B, T], 1 where the token counts; undefined: all do
    bool recompute = false;
  };
  mutable std::optional<RouterBalance> balance;
  mutable const PassCall* pass_call = nullptr;

  // W_down (act(W_gate v) * W_up v) with the weights under `prefix`.
  at::Tensor gated_mlp(const at::Tensor& v, const std::string& prefix, const ExpertNames& n) const {
    const at::Tensor gate = act(host.linear(v, prefix + n.gate + ".weight"));
    return host.linear(gate * host.linear(v, prefix + n.up + ".weight"),
                       prefix + n.down + ".weight");
  }

  // The mixture of experts of layer l on v [B, T, C].
  at::Tensor experts(const at::Tensor& v, int64_t l) const {
    const ExpertNames n = s.expert_names();
    const std::string block = layer(l, n.block) + std::string(".");
    const at::Tensor x = v.reshape({-1, s.n_embd});
    const Routing r =
        route(host.linear(x, block + "gate.weight"), s.top_k, s.norm_topk, x.scalar_type());
    if (balance && pass_call != nullptr) {
      const at::Tensor& mask = pass_call->attention_mask;
      balance->record(r.probs, r.chosen, mask.defined() ? mask.reshape(-1) : mask,
                      pass_call->recompute, host);
    }
    auto prefix = [&](int64_t e) { return block + "experts." + std::to_string(e) + "."; };
    at::Tensor y = mix_experts(
        x, r, s.n_experts,
        [&](int64_t e, const at::Tensor& xe) { return gated_mlp(xe, prefix(e), n); },
        [&](const std::vector<int64_t>& running) {  // their weights, in gated_mlp's order
          std::vector<std::string> names;
          for (const int64_t e : running)
            for (const char* w : {n.gate, n.up, n.down}) names.push_back(prefix(e) + w + ".weight");
          host.expect_weights(names);
        });
    if (s.shared_intermediate > 0)  // Qwen2-MoE: every token, gated by a sigmoid
      y = y + at::sigmoid(host.linear(x, block + "shared_expert_gate.weight")) *
                  gated_mlp(x, block + "shared_expert.", {"", "gate_proj", "up_proj", "down_proj"});
    return y.reshape(v.sizes());
  }

  at::Tensor mlp(const at::Tensor& v, int64_t l) const {
    if (s.has_experts(l)) return experts(v, l);
    if (s.fused_projections) {  // Phi-3: gate's rows, then up's
      const at::Tensor gate_up = proj(v, l, "mlp.gate_up_proj", false);
      const at::Tensor up = gate_up.narrow(-1, s.intermediate, s.intermediate);
      return proj(up * act(gate_up.narrow(-1, 0, s.intermediate)), l, "mlp.down_proj", false);
    }
    at::Tensor gate = act(proj(v, l, "mlp.gate_proj", s.mlp_bias));
    return proj(gate * proj(v, l, "mlp.up_proj", s.mlp_bias), l, "mlp.down_proj", s.mlp_bias);
  }

  // The feed-forward sublayer of layer l on the residual stream a: its norm,
  // the MLP, and Gemma 2's norm after it — every step token by token.
  at::Tensor feed_forward_sublayer(const at::Tensor& a, int64_t l) const {
    if (s.sandwich_norms)  // Gemma 2
      return rms_norm(mlp(rms_norm(a, layer(l, "pre_feedforward_layernorm.weight")), l),
                      layer(l, "post_feedforward_layernorm.weight"));
    return mlp(rms_norm(a, layer(l, "post_attention_layernorm.weight")), l);
  }

  // The sublayer of layer `tag` on x, as the host's tiled_over_tokens calls
  // it (user: the Llama).
  static tf_status tokenwise_feed_forward(void* user, tf_host_context* ctx, int64_t tag,
                                          tf_tensor x, tf_tensor* out) {
    const auto* m = static_cast<const Llama*>(user);
    return tf_sdk::guard(m->host.api(), ctx, [&] {
      *out = tf_sdk::give(m->feed_forward_sublayer(tf_sdk::borrow(x), tag));
      return TF_OK;
    });
  }
  // A dense feed-forward a tile of tokens at a time under [run]
  // mlp_tile_tokens, its norms with it: the tiles keep only the residual
  // stream they start from (the norm's input and output are one tile's);
  // experts run whole (their router's balance loss is over all the tokens).
  at::Tensor feed_forward(const at::Tensor& a, int64_t l) const {
    if (!tiled_mlp || s.has_experts(l)) return feed_forward_sublayer(a, l);
    return host.tiled_over_tokens(a, &Llama::tokenwise_feed_forward, const_cast<Llama*>(this), l);
  }

  at::Tensor block(const at::Tensor& h, int64_t l, KvCache* cache,
                   const at::Tensor& positions = {}) const {
    const at::Tensor y =
        attention(rms_norm(h, layer(l, "input_layernorm.weight")), l, cache, positions);
    const at::Tensor a =
        h + (s.sandwich_norms ? rms_norm(y, layer(l, "post_attention_layernorm.weight")) : y);
    return a + feed_forward(a, l);
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
    if (s.num_labels > 0) return "score.weight";  // *ForSequenceClassification
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

// [run] mlp_tile_tokens from a host that says it (ABI 1.29), else 0.
inline int64_t mlp_tile_tokens(const tf_run_info& info) {
  return info.struct_size >= offsetof(tf_run_info, mlp_tile_tokens) + sizeof info.mlp_tile_tokens
             ? info.mlp_tile_tokens
             : 0;
}

// Declares the stages and parameters of m.s (and what `plan` counts for each).
void declare_parameters(Llama& m, const tf_run_info& info);

}  // namespace llama
