// RWKV-4 (Peng et al. 2023) as a tightfit model plugin, in the architecture
// Hugging Face transformers implements as RwkvForCausalLM (same names, so the
// same weights load).
//
// Per block l (x' = x shifted one step back in time, zero at t = 0):
//   time mixing:    r = sigmoid(W_r mix(x, x', mu_r)),  k = W_k mix(x, x', mu_k),  v = W_v mix(x,
//   x', mu_v)
//                   out = W_o (r * WKV(w, u, k, v)),     mix(a, b, mu) = a mu + b (1 - mu)
//   channel mixing: out = sigmoid(W_r mix(x, x', mu_r)) * W_v relu(W_k mix(x, x', mu_k))^2
//   WKV_t = (sum_{i<t} e^{-(t-1-i) e^w + k_i} v_i + e^{u + k_t} v_t) / (same without v)
//
// WKV runs in chunks of `wkv_chunk` steps: inside a chunk every (t, i) pair is
// one tensor expression, across chunks a running (num, den, max) state is
// carried — the running-max form keeps every exponent <= 0, so nothing overflows.
#include <ATen/ATen.h>

#include <array>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tightfit/activation_bytes.hpp"
#include "tightfit/hf_config.hpp"
#include "tightfit/plugin_sdk.hpp"

namespace {

struct Shape {
  int64_t n_layer = 0, n_embd = 0, attention = 0, intermediate = 0, vocab = 0, context = 0;
  double ln_eps = 1e-5;
  bool tie_embeddings = false;
};

struct Preset {
  const char* name;
  Shape shape;
};

Shape make(int64_t L, int64_t C, int64_t V, int64_t ctx) {
  return Shape{L, C, C, 4 * C, V, ctx, 1e-5, false};
}

const std::array<Preset, 4> kPresets = {{
    {"tiny", make(4, 128, 0, 1024)},
    {"169M", make(12, 768, 50277, 1024)},  // RWKV-4-Pile-169M
    {"430M", make(24, 1024, 50277, 1024)},
    {"1.5B", make(24, 2048, 50277, 1024)},
}};

Shape shape_from_hf_config(const std::string& path) {
  const tf_sdk::HfConfig c = tf_sdk::read_hf_config(path);
  Shape s;
  // Bounded as the recipe's own shape keys are: a config of absurd sizes is
  // refused by name, never planned as some other model.
  s.n_layer = c.need("num_hidden_layers", 1, 10'000);
  s.n_embd = c.need("hidden_size", 1, 1'000'000);
  s.vocab = c.need("vocab_size", 1, 10'000'000);
  s.attention = c.get("attention_hidden_size", s.n_embd, 1, 1'000'000);
  s.intermediate = c.get("intermediate_size", 4 * s.n_embd, 1, 10'000'000);
  s.context = c.get("context_length", 1024, 1, 100'000'000);
  s.ln_eps = c.real("layer_norm_epsilon", 1e-5, 0.0, 1.0);
  s.tie_embeddings = c.flag("tie_word_embeddings", false);
  return s;
}

// x shifted one step later in time: x'_t = x_{t-1}; x'_0 = the last x of the
// previous call when decoding incrementally, else 0.
at::Tensor time_shift(const at::Tensor& x, const at::Tensor& previous) {
  if (!previous.defined()) return at::constant_pad_nd(x, {0, 0, 1, -1});
  return at::cat({previous.unsqueeze(1), x.slice(1, 0, x.size(1) - 1)}, 1);
}

// What a layer carries from one decode call to the next.
struct LayerState {
  at::Tensor att_x, ffn_x;  // last input of time and channel mixing, [B, C]
  at::Tensor num, den, mx;  // WKV state, [B, C] fp32
};

at::Tensor mix(const at::Tensor& x, const at::Tensor& shifted, const at::Tensor& mu) {
  return x * mu + shifted * (1 - mu);
}

// WKV over [B, T, C] keys and values, chunk by chunk (see the file comment).
at::Tensor wkv(const at::Tensor& time_decay, const at::Tensor& time_first, const at::Tensor& key,
               const at::Tensor& value, int64_t chunk, LayerState* state) {
  const int64_t B = key.size(0), T = key.size(1), C = key.size(2);
  const at::Tensor w = time_decay.to(at::kFloat).exp();  // per-step decay rate, > 0
  const at::Tensor u = time_first.to(at::kFloat);
  const at::Tensor k = key.to(at::kFloat), v = value.to(at::kFloat);
  const auto opts = k.options();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  // Carried state: num = sum e^{e - mx} v, den = sum e^{e - mx}, over past steps.
  at::Tensor num = at::zeros({B, C}, opts), den = at::zeros({B, C}, opts),
             mx = at::full({B, C}, -1e38, opts);
  if (state && state->num.defined()) num = state->num, den = state->den, mx = state->mx;
  std::vector<at::Tensor> outs;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t l = std::min(chunk, T - t0);
    const at::Tensor kc = k.slice(1, t0, t0 + l), vc = v.slice(1, t0, t0 + l);
    const at::Tensor a = at::arange(l, opts);
    // Exponent of step b's contribution at step a (b < a): k_b - (a - 1 - b) w.
    const at::Tensor lag = (a.unsqueeze(1) - 1 - a.unsqueeze(0));         // [a, b]
    at::Tensor x = kc.unsqueeze(1) - lag.unsqueeze(0).unsqueeze(-1) * w;  // [B, a, b, C]
    const at::Tensor future =
        (a.unsqueeze(1) <= a.unsqueeze(0)).unsqueeze(0).unsqueeze(-1);  // b >= a
    x = x.masked_fill(future, neg_inf);
    const at::Tensor now = u + kc;                                    // [B, l, C]
    const at::Tensor past = mx.unsqueeze(1) - a.view({1, l, 1}) * w;  // [B, l, C]
    // The stabilizer cancels in the ratio, so it needs no gradient.
    const at::Tensor m = at::maximum(at::maximum(x.amax(2), now), past).detach();
    const at::Tensor p = (x - m.unsqueeze(2)).exp();
    const at::Tensor e_past = (past - m).exp(), e_now = (now - m).exp();
    const at::Tensor numer = (p * vc.unsqueeze(1)).sum(2) + e_past * num.unsqueeze(1) + e_now * vc;
    const at::Tensor denom = p.sum(2) + e_past * den.unsqueeze(1) + e_now;
    outs.push_back(numer / denom);
    // State after the chunk: every step decayed to its end.
    const at::Tensor ex = kc - (l - 1 - a).view({1, l, 1}) * w;  // [B, l, C]
    const at::Tensor carried = mx - static_cast<double>(l) * w;
    const at::Tensor new_mx = at::maximum(ex.amax(1), carried).detach();
    const at::Tensor pe = (ex - new_mx.unsqueeze(1)).exp(), ec = (carried - new_mx).exp();
    num = (pe * vc).sum(1) + ec * num;
    den = pe.sum(1) + ec * den;
    mx = new_mx;
  }
  if (state) state->num = num, state->den = den, state->mx = mx;
  return at::cat(outs, 1).to(value.scalar_type());
}

struct Rwkv {
  tf_sdk::Host host;
  Shape s;
  int64_t chunk = 16;
  std::string hf_config;

  std::string block(int64_t l, const char* rest) const {
    return "rwkv.blocks." + std::to_string(l) + "." + rest;
  }
  // In the input's dtype: with bf16 weights and a base dequantized to fp32
  // (QLoRA under precision bf16), blocks compute in fp32 and the norms follow.
  at::Tensor layer_norm(const at::Tensor& x, const std::string& prefix) const {
    return at::layer_norm(x, {s.n_embd}, host.weight(prefix + ".weight").to(x.scalar_type()),
                          host.weight(prefix + ".bias").to(x.scalar_type()), s.ln_eps);
  }

  at::Tensor time_mixing(const at::Tensor& x, int64_t l, LayerState* st) const {
    const at::Tensor shifted = time_shift(x, st ? st->att_x : at::Tensor());
    if (st) st->att_x = x.select(1, -1);
    const at::Tensor k =
        host.linear(mix(x, shifted, host.weight(block(l, "attention.time_mix_key"))),
                    block(l, "attention.key.weight"));
    const at::Tensor v =
        host.linear(mix(x, shifted, host.weight(block(l, "attention.time_mix_value"))),
                    block(l, "attention.value.weight"));
    const at::Tensor r = at::sigmoid(
        host.linear(mix(x, shifted, host.weight(block(l, "attention.time_mix_receptance"))),
                    block(l, "attention.receptance.weight")));
    const at::Tensor y = wkv(host.weight(block(l, "attention.time_decay")),
                             host.weight(block(l, "attention.time_first")), k, v, chunk, st);
    return host.linear(r * y, block(l, "attention.output.weight"));
  }

  at::Tensor channel_mixing(const at::Tensor& x, int64_t l, LayerState* st) const {
    const at::Tensor shifted = time_shift(x, st ? st->ffn_x : at::Tensor());
    if (st) st->ffn_x = x.select(1, -1);
    at::Tensor k = host.linear(mix(x, shifted, host.weight(block(l, "feed_forward.time_mix_key"))),
                               block(l, "feed_forward.key.weight"));
    k = at::relu(k).square();
    const at::Tensor r = at::sigmoid(
        host.linear(mix(x, shifted, host.weight(block(l, "feed_forward.time_mix_receptance"))),
                    block(l, "feed_forward.receptance.weight")));
    return r * host.linear(k, block(l, "feed_forward.value.weight"));
  }

  at::Tensor forward_block(at::Tensor h, int64_t l, LayerState* st = nullptr) const {
    if (l == 0) h = layer_norm(h, block(0, "pre_ln"));
    h = h + time_mixing(layer_norm(h, block(l, "ln1")), l, st);
    return h + channel_mixing(layer_norm(h, block(l, "ln2")), l, st);
  }

  at::Tensor embed(const at::Tensor& tokens) const {
    return at::embedding(host.weight("rwkv.embeddings.weight"), tokens);
  }
  const char* head_weight() const {
    return s.tie_embeddings ? "rwkv.embeddings.weight" : "head.weight";
  }
  // The logits, or (hidden_only) the hidden state the host projects itself.
  at::Tensor head(const at::Tensor& h, bool hidden_only = false) const {
    const at::Tensor hidden = layer_norm(h, "rwkv.ln_out");
    return hidden_only ? hidden : host.linear(hidden, head_weight());
  }
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto m = std::make_unique<Rwkv>(Rwkv{tf_sdk::Host(api, ctx)});
    const tf_sdk::Host& host = m->host;
    const std::string preset = host.get_string("preset"), config = host.get_string("config");
    if (!config.empty())
      m->s = shape_from_hf_config(config);
    else
      for (const auto& p : kPresets)
        if (preset == p.name) m->s = p.shape;
    Shape& s = m->s;
    auto override_int = [&](const char* key, int64_t& field) {
      if (host.has(key)) field = host.get_int(key);
    };
    override_int("n_layer", s.n_layer);
    override_int("n_embd", s.n_embd);
    if (host.has("n_embd") && !host.has("attention_size")) s.attention = s.n_embd;
    if (host.has("n_embd") && !host.has("intermediate_size")) s.intermediate = 4 * s.n_embd;
    override_int("attention_size", s.attention);
    override_int("intermediate_size", s.intermediate);
    override_int("vocab_size", s.vocab);
    if (host.has("tie_embeddings")) s.tie_embeddings = host.get_bool("tie_embeddings");
    m->chunk = host.get_int("wkv_chunk");
    const tf_run_info info = host.run_info();
    if (s.vocab == 0) s.vocab = info.vocab_size;
    if (s.n_layer <= 0 || s.n_embd <= 0 || s.attention <= 0 || s.intermediate <= 0)
      throw std::invalid_argument("preset \"custom\" needs n_layer and n_embd");
    if (s.attention != s.n_embd)
      throw std::invalid_argument(
          "attention_size must equal n_embd (the time-mixing gate multiplies them)");
    if (s.vocab < info.vocab_size)
      throw std::invalid_argument("vocab_size is smaller than the tokenizer's " +
                                  std::to_string(info.vocab_size));

    const tf_dtype dtype = tf_sdk::parse_dtype(host.get_string("dtype"));
    const int64_t L = s.n_layer, C = s.n_embd, A = s.attention, I = s.intermediate, V = s.vocab;
    const int64_t elt = dtype == TF_DTYPE_F32 ? 4 : 2;
    const uint32_t no_decay = TF_PARAM_NO_WEIGHT_DECAY;
    auto declare = [&](const std::string& name, std::vector<int64_t> shape, int32_t stage,
                       tf_init_kind init, double std, uint32_t flags) {
      host.declare_param(name, std::move(shape), dtype, stage, init, std, flags);
    };

    // Activation bytes per token autograd keeps (for `plan`), measured on
    // LibTorch's kernels: the WKV recurrence runs in fp32 and keeps its
    // [chunk x chunk] exponent tables and its inputs (chunk + 6 values per
    // attention channel); the LayerNorms, token shifts, mixes and
    // projections keep 16 C values and the channel mix 2 I, in the
    // activations' dtype. The embedding's output is block 0's pre-LN input.
    // Frozen, the projections keep no input: the time mix's k, v, r and output
    // inputs, the channel mix's key and receptance inputs (6 C) and value's (I).
    const int64_t wkv_bytes = (m->chunk + 6) * A * 4;
    const int64_t block_bytes = wkv_bytes + (16 * C + 2 * I) * elt;
    const int64_t frozen_block_bytes = wkv_bytes + (10 * C + I) * elt;
    // Gradients alive at once at the peak of a block's backward, measured:
    // the channel mix's two hidden ones (2 I) with the residual's, in fp32
    // as the WKV backward runs; frozen, two more C.
    const int64_t backward_bytes = (2 * I + 2 * C) * 4, frozen_backward_bytes = (2 * I + 4 * C) * 4;
    host.declare_stage("embed", TF_STAGE_EMBED, C * elt + 16, 0, C * elt + 16, C * elt);
    declare("rwkv.embeddings.weight", {V, C}, s.tie_embeddings ? -1 : 0, TF_INIT_UNIFORM, 1e-4, 0);
    for (int64_t l = 0; l < L; ++l) {
      const int32_t st = host.declare_stage(
          "block." + std::to_string(l), TF_STAGE_BLOCK,
          {block_bytes, frozen_block_bytes, C * elt, backward_bytes, frozen_backward_bytes,
           /*decode_cache=*/0, /*decode_state: LayerState=*/2 * C * elt + 3 * A * 4},
          2 * (4 * C * A + 2 * C * I + C * C) + 4 * m->chunk * A);
      if (l == 0) {
        declare(m->block(0, "pre_ln.weight"), {C}, st, TF_INIT_ONES, 0, no_decay);
        declare(m->block(0, "pre_ln.bias"), {C}, st, TF_INIT_ZEROS, 0, no_decay);
      }
      for (const char* ln : {"ln1", "ln2"}) {
        declare(m->block(l, (std::string(ln) + ".weight").c_str()), {C}, st, TF_INIT_ONES, 0,
                no_decay);
        declare(m->block(l, (std::string(ln) + ".bias").c_str()), {C}, st, TF_INIT_ZEROS, 0,
                no_decay);
      }
      // Decay rates e^w spread over channels, from long to short memory.
      declare(m->block(l, "attention.time_decay"), {A}, st, TF_INIT_UNIFORM, 3.0, no_decay);
      declare(m->block(l, "attention.time_first"), {A}, st, TF_INIT_UNIFORM, 0.5, no_decay);
      for (const char* mu :
           {"attention.time_mix_key", "attention.time_mix_value", "attention.time_mix_receptance",
            "feed_forward.time_mix_key", "feed_forward.time_mix_receptance"})
        declare(m->block(l, mu), {1, 1, C}, st, TF_INIT_CONSTANT, 0.5, no_decay);
      declare(m->block(l, "attention.key.weight"), {A, C}, st, TF_INIT_NORMAL, 0.02, 0);
      declare(m->block(l, "attention.value.weight"), {A, C}, st, TF_INIT_NORMAL, 0.02, 0);
      declare(m->block(l, "attention.receptance.weight"), {A, C}, st, TF_INIT_NORMAL, 0.02, 0);
      declare(m->block(l, "attention.output.weight"), {C, A}, st, TF_INIT_ZEROS, 0, 0);
      declare(m->block(l, "feed_forward.key.weight"), {I, C}, st, TF_INIT_NORMAL, 0.02, 0);
      declare(m->block(l, "feed_forward.receptance.weight"), {C, C}, st, TF_INIT_ZEROS, 0, 0);
      declare(m->block(l, "feed_forward.value.weight"), {C, I}, st, TF_INIT_ZEROS, 0, 0);
    }
    const int64_t loss = tf_sdk::loss_activation_bytes(V, elt);
    const int32_t head =
        host.declare_stage("head", TF_STAGE_HEAD, {2 * C * elt + loss, C * elt + loss, V * elt},
                           2 * C * V, {m->head_weight(), "", loss});
    declare("rwkv.ln_out.weight", {C}, head, TF_INIT_ONES, 0, no_decay);
    declare("rwkv.ln_out.bias", {C}, head, TF_INIT_ZEROS, 0, no_decay);
    if (!s.tie_embeddings) declare("head.weight", {V, C}, head, TF_INIT_NORMAL, 0.02, 0);

    m->hf_config = nlohmann::json{{"model_type", "rwkv"},
                                  {"architectures", {"RwkvForCausalLM"}},
                                  {"vocab_size", V},
                                  {"context_length", s.context},
                                  {"hidden_size", C},
                                  {"num_hidden_layers", L},
                                  {"attention_hidden_size", A},
                                  {"intermediate_size", I},
                                  {"layer_norm_epsilon", s.ln_eps},
                                  {"rescale_every", 0},
                                  {"tie_word_embeddings", s.tie_embeddings}}
                       .dump(2);
    host.log(TF_LOG_INFO, "RWKV-4 " + (config.empty() ? preset : config) +
                              ": n_layer=" + std::to_string(L) + " n_embd=" + std::to_string(C) +
                              " vocab=" + std::to_string(V) +
                              " wkv_chunk=" + std::to_string(m->chunk));
    *out = m.release();
    return TF_OK;
  });
}

tf_status stage_forward(void* state, tf_host_context* ctx, const tf_stage_call* call,
                        tf_tensor input, tf_tensor* out) {
  auto* m = static_cast<Rwkv*>(state);
  return tf_sdk::guard(m->host.api(), ctx, [&] {
    const at::Tensor& x = tf_sdk::borrow(input);
    const int64_t last = m->s.n_layer + 1;
    at::Tensor y = call->stage == 0      ? m->embed(x)
                   : call->stage == last ? m->head(x, tf_sdk::head_hidden_only(call))
                                         : m->forward_block(x, call->stage - 1);
    *out = tf_sdk::give(std::move(y));
    return TF_OK;
  });
}

tf_status hf_config_json(void* state, tf_host_context*, const char** out) {
  *out = static_cast<Rwkv*>(state)->hf_config.c_str();
  return TF_OK;
}

// Recurrent generation: each call continues from the carried layer states, so
// a token costs one step, not a pass over the whole context.
tf_status decode(void* state, tf_host_context* ctx, void** cache, tf_tensor tokens,
                 tf_tensor* out) {
  auto* m = static_cast<Rwkv*>(state);
  return tf_sdk::guard(m->host.api(), ctx, [&] {
    if (*cache == nullptr) *cache = new std::vector<LayerState>(static_cast<size_t>(m->s.n_layer));
    auto& layers = *static_cast<std::vector<LayerState>*>(*cache);
    const at::Tensor& x = tf_sdk::borrow(tokens);
    if (const at::Tensor& seen = layers.front().num; seen.defined() && seen.size(0) != x.size(0)) {
      // Fan out (TF_MODEL_FEATURE_DECODE_FANOUT): each row's state repeated.
      if (x.size(0) % seen.size(0) != 0)
        throw std::invalid_argument(
            "decode: " + std::to_string(x.size(0)) + " rows of tokens after a state of " +
            std::to_string(seen.size(0)) + " rows (a multiple of them fans it out)");
      const int64_t k = x.size(0) / seen.size(0);
      for (LayerState& l : layers)
        for (at::Tensor* t : {&l.att_x, &l.ffn_x, &l.num, &l.den, &l.mx})
          if (t->defined()) *t = t->repeat_interleave(k, 0);
    }
    at::Tensor h = m->embed(x);
    for (int64_t l = 0; l < m->s.n_layer; ++l)
      h = m->forward_block(h, l, &layers[static_cast<size_t>(l)]);
    *out = tf_sdk::give(m->head(h));
    return TF_OK;
  });
}

void release_cache(void*, void* cache) {
  delete static_cast<std::vector<LayerState>*>(cache);
}

const tf_config_key kKeys[] = {
    tf_sdk::key("preset", TF_VALUE_STRING, "\"tiny\"",
                "model size: tiny (4x128), 169M, 430M, 1.5B (RWKV-4 Pile shapes), custom", 1, 0,
                "tiny|169M|430M|1.5B|custom"),
    tf_sdk::key("config", TF_VALUE_PATH, "\"\"",
                "Hugging Face config.json (or its folder) giving the shape"),
    tf_sdk::key("n_layer", TF_VALUE_INT, "0", "blocks (overrides)", 0, 1e4),
    tf_sdk::key("n_embd", TF_VALUE_INT, "0", "hidden size (overrides)", 0, 1e6),
    tf_sdk::key("attention_size", TF_VALUE_INT, "0", "time-mixing size; must equal n_embd", 0, 1e6),
    tf_sdk::key("intermediate_size", TF_VALUE_INT, "0", "channel-mixing size (default 4 n_embd)", 0,
                1e7),
    tf_sdk::key("vocab_size", TF_VALUE_INT, "0",
                "vocabulary; 0 = the preset's, else the tokenizer's", 0, 1e7),
    tf_sdk::key("tie_embeddings", TF_VALUE_BOOL, "false",
                "share embeddings with the head (overrides)"),
    tf_sdk::key("wkv_chunk", TF_VALUE_INT, "16",
                "time steps per WKV chunk (speed vs activation memory)", 1, 4096),
    tf_sdk::key("dtype", TF_VALUE_STRING, "\"fp32\"", "parameter dtype", 1, 0, "fp32|bf16|fp16"),
};

const tf_model_vtable kVtable = {.struct_size = sizeof(tf_model_vtable),
                                 .create = create,
                                 .destroy = tf_sdk::destroy_state<Rwkv>,
                                 .stage_forward = stage_forward,
                                 .hf_config_json = hf_config_json,
                                 .decode = decode,
                                 .release_cache = release_cache,
                                 .hf_model_types = "rwkv",
                                 .features = TF_MODEL_FEATURE_DECODE_FANOUT};

const tf_plugin_descriptor kDescriptor =
    tf_sdk::describe(TF_PLUGIN_MODEL, "rwkv", "1.0.0",
                     "RWKV-4 as transformers' RwkvForCausalLM: time mixing "
                     "with chunked, stabilized WKV; channel mixing",
                     kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
