// GPT-2 (Radford et al. 2019) as a tightfit model plugin.
//
// Stages: embed, block.0 .. block.{L-1}, head. Parameter names are those of
// Hugging Face's GPT2LMHeadModel state dict; the Conv1D weights that Hugging
// Face stores as [in, out] are kept here as [out, in] (TF_PARAM_HF_TRANSPOSED)
// so every projection goes through the store's linear service.
//
//   h_0     = W_te[x] + W_pe[0..T)
//   a_l     = h_{l-1} + Attn(LN_1(h_{l-1}))
//   h_l     = a_l + MLP(LN_2(a_l)),       MLP(u) = W_proj gelu(W_fc u)
//   logits  = LN_f(h_L) W_te^T             (tied embeddings)
#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tightfit/activation_bytes.hpp"
#include "tightfit/hf_config.hpp"
#include "tightfit/packed_rows.hpp"
#include "tightfit/plugin_sdk.hpp"
#include "tightfit/tiled_attention.hpp"

namespace {

struct Shape {
  int64_t n_layer, n_embd, n_head, n_positions, vocab;
  int64_t n_inner = 0;  // MLP width; 0 = 4 n_embd
  double eps = 1e-5;    // layer_norm_epsilon
  std::string act = "gelu_new";
  // Dropout probabilities from a config.json (embd, attn, resid); -1 = the recipe's.
  double embd_pdrop = -1, attn_pdrop = -1, resid_pdrop = -1;
  nlohmann::json hf_json;  // the config.json read, kept for export

  int64_t inner() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
};

struct Preset {
  const char* name;
  Shape shape;  // vocab 0 = the tokenizer's
};

const std::array<Preset, 5> kPresets = {{
    {"tiny", {4, 128, 4, 256, 0}},
    {"124M", {12, 768, 12, 1024, 50257}},
    {"350M", {24, 1024, 16, 1024, 50257}},
    {"774M", {36, 1280, 20, 1024, 50257}},
    {"1.5B", {48, 1600, 25, 1024, 50257}},
}};

// The shape from a Hugging Face GPT-2 config.json (file or model folder).
// Keys that change the maths are honoured, or refused by name.
Shape shape_from_hf_config(const std::string& path) {
  const tf_sdk::HfConfig c = tf_sdk::read_hf_config(path);
  if (c.text("model_type", "gpt2") != "gpt2")
    throw std::invalid_argument(c.source + ": model_type \"" + c.text("model_type", "") +
                                "\" is not gpt2; `tightfit plugins list` shows the model plugins");
  Shape s{c.need("n_layer", 1, 10'000), c.need("n_embd", 1, 1'000'000), c.need("n_head", 1, 10'000),
          c.need("n_positions", 1, 10'000'000), c.need("vocab_size", 1, 10'000'000)};
  s.n_inner = c.get("n_inner", 0, 1, 10'000'000);
  s.eps = c.real("layer_norm_epsilon", 1e-5, 0.0, 1.0);
  s.act = c.text("activation_function", "gelu_new");
  if (s.act != "gelu_new" && s.act != "gelu_pytorch_tanh" && s.act != "gelu" && s.act != "relu" &&
      s.act != "silu")
    throw std::invalid_argument(
        c.source + ": activation_function \"" + s.act +
        "\" is not supported (gelu_new, gelu_pytorch_tanh, gelu, relu, silu)");
  s.embd_pdrop = c.real("embd_pdrop", 0.1, 0.0, 1.0, false);
  s.attn_pdrop = c.real("attn_pdrop", 0.1, 0.0, 1.0, false);
  s.resid_pdrop = c.real("resid_pdrop", 0.1, 0.0, 1.0, false);
  if (!c.flag("scale_attn_weights", true))
    throw std::invalid_argument(c.source +
                                ": \"scale_attn_weights\": false (unscaled attention) is not "
                                "supported");
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "add_cross_attention"})
    if (c.flag(key, false))
      throw std::invalid_argument(c.source + ": \"" + key + "\": true is not supported");
  if (c.has("quantization_config"))
    throw std::invalid_argument(c.source +
                                ": \"quantization_config\" names a pre-quantized checkpoint, "
                                "which tightfit does not load: start from the unquantized model");
  s.hf_json = c.json;
  return s;
}

struct Gpt2 {
  tf_sdk::Host host;
  Shape s{};
  double embd_drop = 0.0, attn_drop = 0.0, resid_drop = 0.0;
  at::ScalarType dtype = at::kFloat;
  std::string hf_config;  // config.json for export

  std::string block(int64_t l, const char* rest) const {
    return "transformer.h." + std::to_string(l) + "." + rest;
  }

  // In the input's dtype: with bf16 weights and a base dequantized to fp32
  // (QLoRA under precision bf16), blocks compute in fp32 and the norms follow.
  at::Tensor layer_norm(const at::Tensor& x, const std::string& prefix) const {
    return at::layer_norm(x, {s.n_embd}, host.weight(prefix + ".weight").to(x.scalar_type()),
                          host.weight(prefix + ".bias").to(x.scalar_type()), s.eps);
  }

  static at::Tensor drop(const at::Tensor& x, double p, bool training) {
    return (training && p > 0) ? at::dropout(x, p, true) : x;
  }

  // `positions`: packed rows' own positions [B, T]; undefined = 0..T-1.
  at::Tensor embed(const at::Tensor& tokens, bool training, const at::Tensor& positions) const {
    const int64_t T = tokens.size(1);
    TORCH_CHECK(T <= s.n_positions, "sequence of ", T,
                " tokens is longer than n_positions = ", s.n_positions,
                "; raise [model] n_positions or lower [data] seq_len");
    const at::Tensor pos = positions.defined() ? positions : at::arange(T, tokens.options());
    // W_te is also the head, whose dense [V, C] gradient reaches it first:
    // a sparse gradient from the lookup adds its rows into that one instead
    // of building a second [V, C] tensor (zero-filled, then summed).
    at::Tensor h = at::embedding(host.weight("transformer.wte.weight"), tokens, -1, false,
                                 /*sparse=*/true) +
                   at::embedding(host.weight("transformer.wpe.weight"), pos);
    return drop(h, embd_drop, training);
  }

  // Causal; packed rows (`positions` given) keep each query inside its example.
  at::Tensor attention(const at::Tensor& x, int64_t l, bool training,
                       const at::Tensor& positions) const {
    const int64_t B = x.size(0), T = x.size(1), C = s.n_embd, H = s.n_head, D = C / H;
    at::Tensor qkv = host.linear(x, block(l, "attn.c_attn.weight"), block(l, "attn.c_attn.bias"));
    auto parts = qkv.split(C, -1);
    auto heads = [&](const at::Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };
    const double dropout = training ? attn_drop : 0.0;
    at::Tensor y;
    if (positions.defined() && T >= tf_sdk::kTiledAttentionFrom && dropout == 0) {
      // A long packed row: in tiles, with no [T, T] mask (tiled_attention.hpp).
      y = tf_sdk::tiled_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]),
                                  {1.0 / std::sqrt(static_cast<double>(D)), 0, 0, positions});
    } else {
      std::optional<at::Tensor> mask;
      if (positions.defined()) mask = tf_sdk::packed_causal_mask(positions);
      y = at::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), mask,
                                           dropout, /*is_causal=*/!mask.has_value());
    }
    y = y.transpose(1, 2).reshape({B, T, C});
    return drop(host.linear(y, block(l, "attn.c_proj.weight"), block(l, "attn.c_proj.bias")),
                resid_drop, training);
  }

  at::Tensor mlp(const at::Tensor& x, int64_t l, bool training) const {
    at::Tensor u = host.linear(x, block(l, "mlp.c_fc.weight"), block(l, "mlp.c_fc.bias"));
    u = s.act == "gelu"   ? at::gelu(u)
        : s.act == "relu" ? at::relu(u)
        : s.act == "silu" ? at::silu(u)
                          : at::gelu(u, "tanh");  // gelu_new, gelu_pytorch_tanh
    return drop(host.linear(u, block(l, "mlp.c_proj.weight"), block(l, "mlp.c_proj.bias")),
                resid_drop, training);
  }

  at::Tensor transformer_block(const at::Tensor& h, int64_t l, bool training,
                               const at::Tensor& positions) const {
    at::Tensor a = h + attention(layer_norm(h, block(l, "ln_1")), l, training, positions);
    return a + mlp(layer_norm(a, block(l, "ln_2")), l, training);
  }

  // The logits, or (hidden_only) the hidden state the host projects itself.
  at::Tensor head(const at::Tensor& h, bool hidden_only = false) const {
    const at::Tensor hidden = layer_norm(h, "transformer.ln_f");
    return hidden_only ? hidden : host.linear(hidden, "transformer.wte.weight");
  }
};

void declare(const Gpt2& m, const std::string& name, std::vector<int64_t> shape, int32_t stage,
             tf_init_kind init, double std, uint32_t flags) {
  m.host.declare_param(name, std::move(shape), tf_sdk::parse_dtype(m.host.get_string("dtype")),
                       stage, init, std, flags);
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto m = std::make_unique<Gpt2>(Gpt2{tf_sdk::Host(api, ctx)});
    const tf_sdk::Host& host = m->host;
    const std::string preset = host.get_string("preset");
    const std::string config = host.get_string("config");
    if (!config.empty())
      m->s = shape_from_hf_config(config);
    else
      for (const auto& p : kPresets)
        if (preset == p.name) m->s = p.shape;
    const tf_run_info info = host.run_info();
    auto override_key = [&](const char* key, int64_t& field) {
      if (host.has(key)) field = host.get_int(key);
    };
    override_key("n_layer", m->s.n_layer);
    override_key("n_embd", m->s.n_embd);
    override_key("n_head", m->s.n_head);
    override_key("n_positions", m->s.n_positions);
    override_key("vocab_size", m->s.vocab);
    if (m->s.vocab == 0) m->s.vocab = info.vocab_size;
    if (m->s.n_layer <= 0 || m->s.n_embd <= 0 || m->s.n_head <= 0 || m->s.n_positions <= 0)
      throw std::invalid_argument(
          "preset \"custom\" needs n_layer, n_embd, n_head and n_positions");
    if (m->s.n_embd % m->s.n_head != 0)
      throw std::invalid_argument("n_embd = " + std::to_string(m->s.n_embd) +
                                  " is not divisible by n_head = " + std::to_string(m->s.n_head));
    if (m->s.vocab < info.vocab_size)
      throw std::invalid_argument("vocab_size = " + std::to_string(m->s.vocab) +
                                  " is smaller than the tokenizer's vocabulary (" +
                                  std::to_string(info.vocab_size) + ")");
    if (info.seq_len > m->s.n_positions)
      throw std::invalid_argument("[data] seq_len = " + std::to_string(info.seq_len) +
                                  " exceeds n_positions = " + std::to_string(m->s.n_positions));
    // The recipe's dropout wins; else a config.json's probabilities hold.
    const bool recipe_drop = host.has("dropout") || m->s.resid_pdrop < 0;
    const double d = host.get_double("dropout");
    m->embd_drop = recipe_drop ? d : m->s.embd_pdrop;
    m->attn_drop = recipe_drop ? d : m->s.attn_pdrop;
    m->resid_drop = recipe_drop ? d : m->s.resid_pdrop;
    m->dtype = tf_sdk::scalar_type(tf_sdk::parse_dtype(host.get_string("dtype")));

    if (host.has("n_inner")) m->s.n_inner = host.get_int("n_inner");
    const int64_t L = m->s.n_layer, C = m->s.n_embd, V = m->s.vocab, P = m->s.n_positions;
    const int64_t I = m->s.inner();
    const int64_t elt = m->dtype == at::kFloat ? 4 : 2;
    // Residual-projection init scaled by 1/sqrt(2L), as GPT-2 does.
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
    const uint32_t no_decay = TF_PARAM_NO_WEIGHT_DECAY;

    // Activation bytes per token autograd keeps (for `plan`). A block keeps
    // 16 C values: LN inputs and outputs (4 C), qkv (3 C), attention output
    // (C), MLP input (C) and hidden before and after gelu (8 C) — c_proj's
    // input is a view of the attention output — plus fp32 LN statistics and
    // the attention's log-sum-exp. Dropout adds its masks (1 byte a value)
    // and, in attention, the materialized probabilities and their mask.
    const int64_t H = m->s.n_head, T = host.run_info().seq_len;
    const bool dropping = m->embd_drop > 0 || m->attn_drop > 0 || m->resid_drop > 0;
    // With the block's weights frozen the linears keep no input: LN outputs
    // and gelu's output go (6 C), the rest stays.
    const int64_t extra =
        16 + tf_sdk::attention_lse_bytes(H) + (dropping ? 2 * C + H * T * (2 * elt + 1) : 0);
    const int64_t block_bytes = (8 * C + 2 * I) * elt + extra,
                  frozen_block_bytes = (6 * C + I) * elt + extra;
    // Gradients alive at once at the peak of a block's backward, measured:
    // trained, the output's and input's; frozen, also the MLP hidden's
    // before and after gelu (the frozen linears free no saved input).
    const int64_t backward_bytes = 2 * C * elt, frozen_backward_bytes = (C + 2 * I) * elt;
    const int32_t embed = m->host.declare_stage("embed", TF_STAGE_EMBED, dropping ? C : 0, 0,
                                                dropping ? C : 0, C * elt);
    declare(*m, "transformer.wte.weight", {V, C}, -1, TF_INIT_NORMAL, 0.02, 0);
    declare(*m, "transformer.wpe.weight", {P, C}, embed, TF_INIT_NORMAL, 0.01, 0);
    for (int64_t l = 0; l < L; ++l) {
      const int32_t st = m->host.declare_stage(
          "block." + std::to_string(l), TF_STAGE_BLOCK,
          {block_bytes, frozen_block_bytes, C * elt, backward_bytes, frozen_backward_bytes},
          8 * C * C + 4 * C * I + 2 * T * C);
      const uint32_t t = TF_PARAM_HF_TRANSPOSED;
      declare(*m, m->block(l, "ln_1.weight"), {C}, st, TF_INIT_ONES, 0, no_decay);
      declare(*m, m->block(l, "ln_1.bias"), {C}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->block(l, "attn.c_attn.weight"), {3 * C, C}, st, TF_INIT_NORMAL, 0.02, t);
      declare(*m, m->block(l, "attn.c_attn.bias"), {3 * C}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->block(l, "attn.c_proj.weight"), {C, C}, st, TF_INIT_NORMAL, proj_std, t);
      declare(*m, m->block(l, "attn.c_proj.bias"), {C}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->block(l, "ln_2.weight"), {C}, st, TF_INIT_ONES, 0, no_decay);
      declare(*m, m->block(l, "ln_2.bias"), {C}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->block(l, "mlp.c_fc.weight"), {I, C}, st, TF_INIT_NORMAL, 0.02, t);
      declare(*m, m->block(l, "mlp.c_fc.bias"), {I}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->block(l, "mlp.c_proj.weight"), {C, I}, st, TF_INIT_NORMAL, proj_std, t);
      declare(*m, m->block(l, "mlp.c_proj.bias"), {C}, st, TF_INIT_ZEROS, 0, no_decay);
    }
    // ln_f's input and output (its output only for the tied head's weight
    // gradient), then the loss's logits.
    const int64_t loss = tf_sdk::loss_activation_bytes(V, elt);
    const int32_t head = m->host.declare_stage(
        "head", TF_STAGE_HEAD, {2 * C * elt + 8 + loss, C * elt + 8 + loss, V * elt}, 2 * C * V,
        {"transformer.wte.weight", "", loss});
    declare(*m, "transformer.ln_f.weight", {C}, head, TF_INIT_ONES, 0, no_decay);
    declare(*m, "transformer.ln_f.bias", {C}, head, TF_INIT_ZEROS, 0, no_decay);
    nlohmann::json cfg = m->s.hf_json.is_object() ? m->s.hf_json : nlohmann::json::object();
    cfg.update({{"model_type", "gpt2"},
                {"architectures", {"GPT2LMHeadModel"}},
                {"vocab_size", V},
                {"n_positions", P},
                {"n_embd", C},
                {"n_layer", L},
                {"n_head", m->s.n_head},
                {"n_inner", m->s.n_inner > 0 ? nlohmann::json(m->s.n_inner) : nlohmann::json()},
                {"activation_function", m->s.act},
                {"resid_pdrop", m->resid_drop},
                {"embd_pdrop", m->embd_drop},
                {"attn_pdrop", m->attn_drop},
                {"layer_norm_epsilon", m->s.eps},
                {"tie_word_embeddings", true},
                {"torch_dtype", host.get_string("dtype") == "fp32" ? "float32" : "bfloat16"}});
    if (!cfg.contains("initializer_range")) cfg["initializer_range"] = 0.02;
    m->hf_config = cfg.dump(2);
    host.log(TF_LOG_INFO,
             "GPT-2 " + preset + ": n_layer=" + std::to_string(L) + " n_embd=" + std::to_string(C) +
                 " n_head=" + std::to_string(m->s.n_head) + " vocab=" + std::to_string(V));
    *out = m.release();
    return TF_OK;
  });
}

tf_status stage_forward(void* state, tf_host_context* ctx, const tf_stage_call* call,
                        tf_tensor input, tf_tensor* out) {
  auto* m = static_cast<Gpt2*>(state);
  return tf_sdk::guard(m->host.api(), ctx, [&] {
    const at::Tensor& x = tf_sdk::borrow(input);
    const bool training = call->training != 0;
    const int64_t last = m->s.n_layer + 1;
    const at::Tensor positions = tf_sdk::call_positions(call);
    at::Tensor y;
    if (call->stage == 0)
      y = m->embed(x, training, positions);
    else if (call->stage == last)
      y = m->head(x, tf_sdk::head_hidden_only(call));
    else
      y = m->transformer_block(x, call->stage - 1, training, positions);
    *out = tf_sdk::give(std::move(y));
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("preset", TF_VALUE_STRING, "\"tiny\"", "model size", 1, 0,
                "tiny|124M|350M|774M|1.5B|custom"),
    tf_sdk::key("config", TF_VALUE_PATH, "\"\"",
                "Hugging Face config.json (or its folder) giving the shape"),
    tf_sdk::key("n_layer", TF_VALUE_INT, "0", "transformer blocks (overrides the preset)", 0, 1e4),
    tf_sdk::key("n_embd", TF_VALUE_INT, "0", "hidden size (overrides the preset)", 0, 1e6),
    tf_sdk::key("n_head", TF_VALUE_INT, "0", "attention heads (overrides the preset)", 0, 1e4),
    tf_sdk::key("n_positions", TF_VALUE_INT, "0", "maximum sequence length (overrides the preset)",
                0, 1e7),
    tf_sdk::key("vocab_size", TF_VALUE_INT, "0",
                "vocabulary; 0 = the preset's, else the tokenizer's", 0, 1e7),
    tf_sdk::key("n_inner", TF_VALUE_INT, "0", "MLP width; 0 = 4 n_embd (overrides)", 0, 1e7),
    tf_sdk::key("dropout", TF_VALUE_FLOAT, "0.0",
                "dropout probability in training (overrides a config.json's embd/attn/resid_pdrop)",
                0, 1),
    tf_sdk::key("dtype", TF_VALUE_STRING, "\"fp32\"", "parameter dtype", 1, 0, "fp32|bf16|fp16"),
};

tf_status hf_config_json(void* state, tf_host_context*, const char** out) {
  *out = static_cast<Gpt2*>(state)->hf_config.c_str();
  return TF_OK;
}

const tf_model_vtable kVtable = {.struct_size = sizeof(tf_model_vtable),
                                 .create = create,
                                 .destroy = tf_sdk::destroy_state<Gpt2>,
                                 .stage_forward = stage_forward,
                                 .hf_config_json = hf_config_json,
                                 .hf_model_types = "gpt2",
                                 .features = TF_MODEL_FEATURE_POSITIONS};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_MODEL, "gpt2", "1.0.0",
    "GPT-2 with Hugging Face parameter names; presets tiny, 124M, 350M, 774M, 1.5B", kKeys,
    &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
