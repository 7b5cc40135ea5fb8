// The llama plugin's entry points: create (shape from a preset or a
// config.json, overrides), the stage forward, incremental decoding, keys.
// The model's equations are in llama_model.hpp.
#include <memory>
#include <string>

#include "llama_model.hpp"
#include "tightfit/plugin_sdk.hpp"

namespace {

using llama::KvCache;
using llama::Llama;
using llama::Shape;

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
    // Mixtral's and OLMoE's experts are intermediate_size wide (Qwen-MoE's
    // have moe_intermediate_size, and intermediate_size is its dense MLPs').
    if (s.model_type == "mixtral" || s.model_type == "olmoe")
      s.expert_intermediate = s.intermediate;
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

    m->tiled_mlp = llama::mlp_tile_tokens(info) > 0;
    if (m->tiled_mlp && s.n_experts > 0) {
      int64_t routed = 0;
      for (int64_t l = 0; l < s.n_layer; ++l) routed += s.has_experts(l) ? 1 : 0;
      if (routed > 0)
        host.log(TF_LOG_WARN, "[run] mlp_tile_tokens tiles the dense feed-forwards only: the " +
                                  std::to_string(routed) +
                                  " layers of experts run on all tokens at once (their router's "
                                  "balance loss is over all of them), and the plan counts them so");
    }
    llama::declare_parameters(*m, info);
    if (s.router_aux_coef > 0) m->balance.emplace(s.router_aux_coef, s.n_experts);
    const int64_t L = s.n_layer, C = s.n_embd, V = s.vocab;
    const nlohmann::json cfg = llama::hf_config_for_export(s, host.get_string("dtype"));
    m->hf_config = cfg.dump(2);
    host.log(
        TF_LOG_INFO,
        s.model_type + " " + (config.empty() ? preset : config) + ": n_layer=" + std::to_string(L) +
            " n_embd=" + std::to_string(C) + " n_head=" + std::to_string(s.n_head) +
            " n_kv_head=" + std::to_string(s.n_kv_head) + " vocab=" + std::to_string(V) +
            (s.n_experts > 0
                 ? " experts=" + std::to_string(s.n_experts) + " top_k=" + std::to_string(s.top_k)
                 : std::string()) +
            (s.router_aux_coef > 0 ? " router_aux_loss_coef=" + c10::str(s.router_aux_coef)
                                   : std::string()));
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
    const Llama::PassCall pass{tf_sdk::call_attention_mask(call), call->recompute != 0};
    m->pass_call = &pass;
    struct Clear {
      const Llama::PassCall*& slot;
      ~Clear() { slot = nullptr; }
    } clear{m->pass_call};
    if (m->balance && call->stage == 0 && !pass.recompute) m->balance->begin_pass();
    at::Tensor y = call->stage == 0 ? m->embed(x)
                   : call->stage == last
                       ? m->head(x, tf_sdk::head_hidden_only(call))
                       : m->block(x, call->stage - 1, nullptr, tf_sdk::call_positions(call));
    if (m->balance && call->stage == last) m->balance->end_pass(pass.recompute, m->host);
    *out = tf_sdk::give(std::move(y));
    return TF_OK;
  });
}

// Incremental decoding: the new tokens attend to the cached keys and values.
// Tokens with k times the cache's rows repeat each cached row k times first
// (TF_MODEL_FEATURE_DECODE_FANOUT). `starts` (decode_rows): each row's first real column; the
// columns before it are padding no position sees, and its positions count from it.
at::Tensor decode_tokens(const Llama& m, void** cache, const at::Tensor& x,
                         const at::Tensor& starts) {
  if (*cache == nullptr) {
    auto* c = new KvCache();
    c->k.resize(static_cast<size_t>(m.s.n_layer));
    c->v.resize(static_cast<size_t>(m.s.n_layer));
    *cache = c;
  }
  auto& c = *static_cast<KvCache*>(*cache);
  if (c.length + x.size(1) > m.s.max_positions)
    throw std::invalid_argument(
        "generation reached max_positions = " + std::to_string(m.s.max_positions) +
        " tokens (prompt and new tokens together)");
  if (c.length > 0 && c.k.front().size(0) != x.size(0)) {  // fan out (a prompt's completions)
    const int64_t rows = c.k.front().size(0);
    if (x.size(0) % rows != 0)
      throw std::invalid_argument("decode: " + std::to_string(x.size(0)) +
                                  " rows of tokens after a cache of " + std::to_string(rows) +
                                  " rows (a multiple of them fans it out)");
    const int64_t k = x.size(0) / rows;
    for (std::vector<at::Tensor>* layers : {&c.k, &c.v})
      for (at::Tensor& t : *layers) t = t.repeat_interleave(k, 0);
    if (c.starts.defined()) c.starts = c.starts.repeat_interleave(k);
  }
  if (starts.defined()) {
    if (starts.dim() != 1 || starts.size(0) != x.size(0) || starts.scalar_type() != at::kLong)
      throw std::invalid_argument("decode_rows: starts must be int64 [B], one per row");
    if (!c.starts.defined()) c.starts = starts.to(x.device());
    // Each new query's column, and every key's column so far.
    const int64_t T = x.size(1), S = c.length + T;
    const at::Tensor row_start = c.starts.unsqueeze(1);                    // [B, 1]
    const at::Tensor query = at::arange(c.length, S, c.starts.options());  // [T]
    const at::Tensor key = at::arange(S, c.starts.options());              // [S]
    c.positions = (query.unsqueeze(0) - row_start).clamp_min(0);           // [B, T]
    const at::Tensor real = (key.unsqueeze(0) >= row_start).unsqueeze(1);  // [B, 1, S]
    const at::Tensor causal = key.unsqueeze(0) <= query.unsqueeze(1);      // [T, S]
    // A padding column sees itself, so that no row of the softmax is empty.
    const at::Tensor itself = key.unsqueeze(0) == query.unsqueeze(1);
    c.keys = ((real & causal) | itself).unsqueeze(1);  // [B, 1, T, S]
    if (m.s.sliding_window > 0)
      c.window_keys = c.keys & (key.unsqueeze(0) > query.unsqueeze(1) - m.s.sliding_window);
  }
  at::Tensor h = m.embed(x);  // Gemma's scaling too
  for (int64_t l = 0; l < m.s.n_layer; ++l) h = m.block(h, l, &c);
  c.length += x.size(1);
  return m.head(h);
}

tf_status decode(void* state, tf_host_context* ctx, void** cache, tf_tensor tokens,
                 tf_tensor* out) {
  auto* m = static_cast<Llama*>(state);
  return tf_sdk::guard(m->host.api(), ctx, [&] {
    *out = tf_sdk::give(decode_tokens(*m, cache, tf_sdk::borrow(tokens), {}));
    return TF_OK;
  });
}

tf_status decode_rows(void* state, tf_host_context* ctx, void** cache, tf_tensor tokens,
                      tf_tensor starts, tf_tensor* out) {
  auto* m = static_cast<Llama*>(state);
  return tf_sdk::guard(m->host.api(), ctx, [&] {
    *out = tf_sdk::give(
        decode_tokens(*m, cache, tf_sdk::borrow(tokens), tf_sdk::borrow(starts).to(at::kLong)));
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
    tf_sdk::key(
        "config", TF_VALUE_PATH, "\"\"",
        "Hugging Face config.json (or its folder) giving the shape; model_type llama, "
        "mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, mixtral, qwen2_moe, qwen3_moe or "
        "olmoe"),
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
                                 .features = TF_MODEL_FEATURE_POSITIONS |
                                             TF_MODEL_FEATURE_DECODE_FANOUT |
                                             TF_MODEL_FEATURE_TILED_MLP,
                                 .decode_rows = decode_rows};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_MODEL, "llama", "1.0.0",
    "LLaMA 1/2/3, Mistral, Qwen2, Qwen3, Gemma 1/2/3, Phi-3 decoders and the Mixtral, "
    "Qwen2-MoE, Qwen3-MoE, OLMoE mixtures of experts: RMSNorm, rotary "
    "(linear/dynamic/llama3/yarn/longrope), SwiGLU, grouped-query and sliding-window "
    "attention, routed experts; Hugging Face names",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
