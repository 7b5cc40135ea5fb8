#include "decoder_shape.hpp"

#include <stdexcept>

#include "tightfit/hf_config.hpp"

namespace llama {
namespace {

Shape make(int64_t L, int64_t C, int64_t H, int64_t KVH, int64_t I, int64_t V, int64_t P,
           double theta, bool tie) {
  Shape s;
  s.n_layer = L, s.n_embd = C, s.n_head = H, s.n_kv_head = KVH, s.intermediate = I, s.vocab = V;
  s.max_positions = P, s.rope_theta = theta, s.tie_embeddings = tie;
  return s;
}

Shape llama3(Shape s, double factor) {
  s.rope_scaling = "llama3";
  s.rope_factor = factor;
  s.rope_low_freq_factor = 1.0;
  s.rope_high_freq_factor = 4.0;
  s.rope_original_max_positions = 8192;
  return s;
}

Shape qwen2(Shape s) {
  s.model_type = "qwen2";
  s.qkv_bias = true;
  s.rms_eps = 1e-6;
  return s;
}

// What transformers assumes for a key the config.json leaves out, by model type.
struct TypeDefaults {
  const char* type;
  int64_t max_positions;
  double rms_eps;
};
constexpr TypeDefaults kDefaults[] = {
    {"llama", 2048, 1e-6},         {"mistral", 4096 * 32, 1e-6}, {"qwen2", 32768, 1e-6},
    {"qwen3", 32768, 1e-6},        {"gemma", 8192, 1e-6},        {"gemma2", 8192, 1e-6},
    {"gemma3_text", 131072, 1e-6}, {"phi3", 4096, 1e-5},         {"mixtral", 4096 * 32, 1e-5},
    {"qwen2_moe", 32768, 1e-6},    {"qwen3_moe", 32768, 1e-6},   {"olmoe", 4096, 1e-5}};

const char* const kActivations = "silu, swish, gelu, gelu_new, gelu_pytorch_tanh, relu";
bool activation_supported(const std::string& act) {
  for (const char* a : {"silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu"})
    if (act == a) return true;
  return false;
}

// Phi3Config's rope_scaling: exactly "type" (longrope; su and yarn are its
// old names) and the short and long divisors, rotary_dim / 2 of each.
void read_longrope(const tf_sdk::HfConfig& c, const nlohmann::json& r, Shape& s) {
  auto bad = [&](const std::string& what) {
    throw std::invalid_argument(c.source + ": rope_scaling " + what);
  };
  const nlohmann::json type = r.contains("type") ? r["type"] : nlohmann::json();
  if (!type.is_string() || (type != "longrope" && type != "su" && type != "yarn"))
    bad("of a phi3 model needs \"type\": \"longrope\" (as Phi3Config validates it)");
  for (const auto& [key, value] : r.items())
    if (key != "type" && key != "short_factor" && key != "long_factor")
      bad("of a phi3 model has \"" + key +
          "\", which Phi3Config refuses: it takes type, short_factor and long_factor only");
  const size_t n = static_cast<size_t>(s.rotary_dim() / 2);
  for (const char* key : {"short_factor", "long_factor"}) {
    const nlohmann::json& f = r.contains(key) ? r[key] : nlohmann::json();
    if (!f.is_array() || f.size() != n)
      bad(std::string(key) + " must list " + std::to_string(n) +
          " numbers (one per rotated frequency)");
    std::vector<double>& out =
        std::string(key) == "short_factor" ? s.longrope_short : s.longrope_long;
    out.clear();
    for (size_t i = 0; i < n; ++i)
      out.push_back(c.real_of(f[i], std::string("rope_scaling.") + key, 0.0, 1e12));
  }
  s.rope_scaling = "longrope";
}

void read_rope(const tf_sdk::HfConfig& c, const nlohmann::json& r, Shape& s) {
  if (!r.is_object())
    throw std::invalid_argument(c.source + ": \"rope_scaling\" must be an object or null");
  if (s.model_type == "phi3") return read_longrope(c, r, s);
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (r.contains(k) && !r[k].is_null()) {
      if (!r[k].is_string())
        throw std::invalid_argument(c.source + ": rope_scaling." + k + " must be a string");
      type = r[k].get<std::string>();
      break;
    }
  if (type == "default") return;
  if (type != "linear" && type != "dynamic" && type != "llama3" && type != "yarn")
    throw std::invalid_argument(c.source + ": rope_scaling type \"" + type +
                                "\" is not supported (default, linear, dynamic, llama3, yarn)");
  s.rope_scaling = type;
  auto num = [&](const char* key, double fallback, double lo, double hi) {
    return r.contains(key) && !r[key].is_null()
               ? c.real_of(r[key], std::string("rope_scaling.") + key, lo, hi)
               : fallback;
  };
  if (!r.contains("factor") || r["factor"].is_null())
    throw std::invalid_argument(c.source + ": rope_scaling type \"" + type +
                                "\" needs a \"factor\"");
  s.rope_factor = num("factor", 1.0, 0.0, 1e6);
  if (type == "llama3") {
    s.rope_low_freq_factor = num("low_freq_factor", 1.0, 0.0, 1e6);
    s.rope_high_freq_factor = num("high_freq_factor", 4.0, 0.0, 1e6);
    if (s.rope_high_freq_factor <= s.rope_low_freq_factor)
      throw std::invalid_argument(c.source +
                                  ": rope_scaling.high_freq_factor must exceed low_freq_factor");
  }
  if (type == "llama3" || type == "yarn") {
    const double fallback = type == "yarn" ? static_cast<double>(s.max_positions) : -1;
    const double orig = num("original_max_position_embeddings", fallback, 0.0, 1e9);
    if (orig < 0)
      throw std::invalid_argument(
          c.source + ": rope_scaling type llama3 needs original_max_position_embeddings");
    if (orig != static_cast<double>(static_cast<int64_t>(orig)))
      throw std::invalid_argument(
          c.source + ": rope_scaling.original_max_position_embeddings must be an integer");
    s.rope_original_max_positions = static_cast<int64_t>(orig);
  }
  if (type == "yarn") {
    s.yarn_beta_fast = num("beta_fast", 32.0, 0.0, 1e6);
    s.yarn_beta_slow = num("beta_slow", 1.0, 0.0, 1e6);
    s.yarn_attention_factor = num("attention_factor", 0.0, 0.0, 1e6);
    s.yarn_mscale = num("mscale", 0.0, -1.0, 1e6);
    s.yarn_mscale_all_dim = num("mscale_all_dim", 0.0, -1.0, 1e6);
    if (r.contains("truncate") && !r["truncate"].is_null()) {
      if (!r["truncate"].is_boolean())
        throw std::invalid_argument(c.source + ": rope_scaling.truncate must be true or false");
      s.yarn_truncate = r["truncate"].get<bool>();
    }
  }
}

// Which layers a family windows, and when (transformers 4.57's rule for each).
enum class WindowRule {
  kNone,             // LLaMA, Gemma 1, OLMoE
  kEveryLayer4096,   // Mistral: every layer; 4096 when the key is absent, null = none
  kEveryLayerIfSet,  // Phi-3, Mixtral: every layer when sliding_window is set
  kEveryLayerIfUse,  // Qwen3-MoE: every layer when use_sliding_window
  kQwen2,            // Qwen2, Qwen3: use_sliding_window; layer_types or from max_window_layers up
  kGemma,            // Gemma 2 / 3: layer_types, or every pattern-th layer full
  kRefused,          // Qwen2-MoE: use_sliding_window refused (see refuse_unsupported)
};

WindowRule window_rule(const std::string& type) {
  static const std::pair<const char*, WindowRule> kRules[] = {
      {"mistral", WindowRule::kEveryLayer4096},
      {"phi3", WindowRule::kEveryLayerIfSet},
      {"mixtral", WindowRule::kEveryLayerIfSet},
      {"qwen3_moe", WindowRule::kEveryLayerIfUse},
      {"qwen2", WindowRule::kQwen2},
      {"qwen3", WindowRule::kQwen2},
      {"gemma2", WindowRule::kGemma},
      {"gemma3_text", WindowRule::kGemma},
      {"qwen2_moe", WindowRule::kRefused}};
  for (const auto& [t, rule] : kRules)
    if (type == t) return rule;
  return WindowRule::kNone;
}

void read_layer_types(const tf_sdk::HfConfig& c, Shape& s) {
  const nlohmann::json& types = c.json["layer_types"];
  if (!types.is_array() || static_cast<int64_t>(types.size()) != s.n_layer)
    throw std::invalid_argument(c.source + ": \"layer_types\" must list num_hidden_layers = " +
                                std::to_string(s.n_layer) + " entries");
  for (size_t l = 0; l < types.size(); ++l) {
    const std::string t = types[l].is_string() ? types[l].get<std::string>() : "";
    if (t != "sliding_attention" && t != "full_attention")
      throw std::invalid_argument(c.source + ": layer_types[" + std::to_string(l) +
                                  "] must be \"full_attention\" or \"sliding_attention\"");
    s.sliding_layers[l] = t == "sliding_attention";
  }
}

void read_sliding_window(const tf_sdk::HfConfig& c, Shape& s) {
  const auto L = static_cast<size_t>(s.n_layer);
  s.sliding_layers.assign(L, false);
  auto window = [&](int64_t fallback) {
    return c.get("sliding_window", fallback, 1, 1'000'000'000);
  };
  switch (window_rule(s.model_type)) {
    case WindowRule::kNone:
    case WindowRule::kRefused:
      return;
    case WindowRule::kEveryLayer4096:
      s.sliding_window = c.json.contains("sliding_window") ? window(0) : 4096;
      break;
    case WindowRule::kEveryLayerIfSet:
      s.sliding_window = window(0);
      break;
    case WindowRule::kEveryLayerIfUse:
      if (c.flag("use_sliding_window", false)) s.sliding_window = window(4096);
      break;
    case WindowRule::kQwen2:
      if (!c.flag("use_sliding_window", false)) return;
      s.sliding_window = window(4096);
      if (c.has("layer_types")) return read_layer_types(c, s);
      for (int64_t l = c.get("max_window_layers", 28, 0, 1'000'000); l < s.n_layer; ++l)
        s.sliding_layers[static_cast<size_t>(l)] = true;
      return;
    case WindowRule::kGemma: {
      s.sliding_window = window(4096);
      if (c.has("layer_types")) return read_layer_types(c, s);
      // Gemma2Config: even layers slide, odd are full. Gemma3TextConfig: every
      // sliding_window_pattern-th layer is full (the key its configs on the Hub keep).
      const int64_t pattern =
          s.model_type == "gemma2" ? 2 : c.get("sliding_window_pattern", 6, 1, 1'000'000);
      for (int64_t l = 0; l < s.n_layer; ++l)
        s.sliding_layers[static_cast<size_t>(l)] = (l + 1) % pattern != 0;
      return;
    }
  }
  s.sliding_layers.assign(L, s.sliding_window > 0);  // the every-layer rules
}

// The mixture-of-experts keys of Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE
// (their config classes' defaults when absent).
void read_experts(const tf_sdk::HfConfig& c, Shape& s) {
  const std::string& t = s.model_type;
  const bool mixtral = t == "mixtral", qwen = t == "qwen2_moe" || t == "qwen3_moe";
  if (!mixtral && !qwen && t != "olmoe") return;
  const int64_t default_experts = mixtral ? 8 : t == "qwen2_moe" ? 60 : t == "qwen3_moe" ? 128 : 64;
  s.n_experts =
      c.get(mixtral ? "num_local_experts" : "num_experts", default_experts, qwen ? 0 : 1, 100'000);
  s.top_k = c.get("num_experts_per_tok", mixtral ? 2 : t == "qwen2_moe" ? 4 : 8, 1, 100'000);
  if (s.n_experts > 0 && s.top_k > s.n_experts)
    throw std::invalid_argument(c.source + ": num_experts_per_tok = " + std::to_string(s.top_k) +
                                " exceeds the " + std::to_string(s.n_experts) + " experts");
  // Mixtral always renormalizes the top k; the others when norm_topk_prob.
  s.norm_topk = mixtral || c.flag("norm_topk_prob", false);
  s.expert_intermediate =
      qwen ? c.get("moe_intermediate_size", t == "qwen2_moe" ? 1408 : 768, 1, 10'000'000)
           : s.intermediate;
  if (t == "qwen2_moe")
    s.shared_intermediate = c.get("shared_expert_intermediate_size", 5632, 1, 10'000'000);
  // As the ForCausalLM classes: the term joins the loss only when
  // output_router_logits (their default false) is set.
  const double coef = c.real("router_aux_loss_coef", t == "olmoe" ? 0.01 : 0.001, 0.0, 1e6, false);
  if (c.flag("output_router_logits", false)) s.router_aux_coef = coef;
  if (!qwen) return;
  // Qwen*MoeDecoderLayer: experts where (l + 1) % decoder_sparse_step == 0
  // and l is not in mlp_only_layers; a dense MLP of intermediate_size elsewhere.
  s.sparse_step = c.get("decoder_sparse_step", 1, 1, 1'000'000);
  s.dense_layers.clear();
  if (c.has("mlp_only_layers")) {
    const nlohmann::json& only = c.json["mlp_only_layers"];
    if (!only.is_array() || only.size() > 1'000'000)
      throw std::invalid_argument(c.source +
                                  ": \"mlp_only_layers\" must be a list of layer numbers");
    for (const auto& l : only) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0)
        throw std::invalid_argument(c.source +
                                    ": \"mlp_only_layers\" must list layer numbers (0, 1, ...)");
      s.dense_layers.push_back(l.get<int64_t>());
    }
  }
}

// Keys of other families that change the maths in ways this plugin does not compute.
void refuse_unsupported(const tf_sdk::HfConfig& c, const Shape& s) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw std::invalid_argument(c.source + ": \"" + key + "\" " + why);
  };
  if (c.has("quantization_config"))
    refuse("quantization_config",
           "names a pre-quantized checkpoint, which tightfit does not load: start from the "
           "unquantized model and add [[strategy]] plugin = \"quantize\"");
  const bool phi3 = s.model_type == "phi3";
  if (!phi3 && c.has("partial_rotary_factor") &&
      c.real("partial_rotary_factor", 1.0, 0.0, 1.0) != 1.0)
    refuse("partial_rotary_factor",
           "below 1 (rotary on part of each head) is computed for model_type phi3 only");
  for (const char* key : {"attention_dropout", "resid_pdrop", "embd_pdrop"})
    if ((phi3 || std::string(key) == "attention_dropout") &&
        c.real(key, 0.0, 0.0, 1.0, false) != 0.0)
      refuse(key,
             "(dropout) is not supported: training would differ from transformers'; set "
             "it to 0.0");
  const bool gemma3 = s.model_type == "gemma3_text";
  if (s.model_type != "gemma2" && !gemma3)
    for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
      if (c.has(key))
        refuse(key, "(logit soft-capping) is computed for model_type gemma2 and gemma3_text only");
  // Gemma3Attention (transformers 4.57) keeps the cap but never passes it to
  // its attention: a value would be silently unused there, so it is refused.
  if (gemma3 && c.has("attn_logit_softcapping"))
    refuse("attn_logit_softcapping",
           "is not applied by transformers' gemma3_text attention, so tightfit does not apply "
           "it either: set it to null");
  if (gemma3 && c.flag("use_bidirectional_attention", false))
    refuse("use_bidirectional_attention",
           "(EmbeddingGemma's attention both ways) is not a causal language model: set it to "
           "false");
  if (s.model_type != "qwen3")
    for (const char* key : {"use_qk_norm", "qk_layernorm", "qk_norm"})
      if (c.has(key) && (!c.json[key].is_boolean() || c.json[key].get<bool>()))
        refuse(key, "(a norm over q and k) is computed for model_type qwen3 only");
  if (s.model_type == "mixtral" && c.real("router_jitter_noise", 0.0, 0.0, 1.0, false) != 0.0)
    refuse("router_jitter_noise",
           "(random scaling of the router's input in training) is not supported: training "
           "would differ from transformers'; set it to 0.0");
  if (s.model_type == "qwen2_moe" && c.flag("use_sliding_window", false))
    refuse("use_sliding_window",
           "of qwen2_moe windows every layer or only those past max_window_layers depending on "
           "transformers' attention implementation; tightfit does not guess: set it to false");
  if (c.has("rope_parameters") && !c.has("rope_scaling"))
    refuse("rope_parameters",
           "is the transformers 5 spelling: save the config with transformers 4.x "
           "(rope_theta and rope_scaling)");
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"tiny", make(4, 128, 4, 2, 352, 0, 512, 10000.0, false)},
      {"1B", llama3(make(16, 2048, 32, 8, 8192, 128256, 131072, 500000.0, true), 32.0)},
      {"7B", make(32, 4096, 32, 32, 11008, 32000, 4096, 10000.0, false)},   // Llama-2-7B
      {"13B", make(40, 5120, 40, 40, 13824, 32000, 4096, 10000.0, false)},  // Llama-2-13B
      {"30B", make(60, 6656, 52, 52, 17920, 32000, 2048, 10000.0, false)},  // LLaMA-30B (33B)
      {"70B", make(80, 8192, 64, 8, 28672, 32000, 4096, 10000.0, false)},   // Llama-2-70B
      // DeepSeek-R1-Distill-Qwen-1.5B / Qwen2.5-1.5B: q/k/v biases, untied head.
      {"qwen2-1.5B", qwen2(make(28, 1536, 12, 2, 8960, 151936, 131072, 10000.0, false))},
  };
  return p;
}

// A *ForSequenceClassification config (transformers' reward models): its
// labels are id2label's (PretrainedConfig's num_labels, 2 when it has none),
// and the score head is never tied to the embeddings.
void read_sequence_classification(const tf_sdk::HfConfig& c, Shape& s) {
  const auto it = c.json.find("architectures");
  if (it == c.json.end() || !it->is_array()) return;
  bool classifies = false;
  for (const nlohmann::json& a : *it)
    if (a.is_string() && a.get<std::string>().ends_with("ForSequenceClassification"))
      classifies = true;
  if (!classifies) return;
  const auto labels = c.json.find("id2label");
  s.num_labels = labels != c.json.end() && labels->is_object() && !labels->empty()
                     ? static_cast<int64_t>(labels->size())
                     : c.get("num_labels", 2, 1, 1'000'000);
  if (s.num_labels > 1'000'000)
    throw std::invalid_argument(c.source + ": id2label has " + std::to_string(s.num_labels) +
                                " labels; at most 1,000,000 are read");
  s.tie_embeddings = false;
}

Shape shape_from_hf_config(const std::string& path) {
  const tf_sdk::HfConfig c = tf_sdk::read_hf_config(path);
  Shape s;
  s.hf_json = c.json;
  s.model_type = c.text("model_type", "llama");
  const TypeDefaults* d = nullptr;
  for (const auto& t : kDefaults)
    if (s.model_type == t.type) d = &t;
  if (!d)
    throw std::invalid_argument(c.source + ": model_type \"" + s.model_type +
                                "\" is not one the llama plugin computes (" + kModelTypes +
                                "); `tightfit plugins list` shows the model plugins");
  s.n_layer = c.need("num_hidden_layers", 1, 10'000);
  s.n_embd = c.need("hidden_size", 1, 1'000'000);
  s.n_head = c.need("num_attention_heads", 1, 10'000);
  s.n_kv_head = c.get("num_key_value_heads", s.n_head, 1, s.n_head);
  s.intermediate = c.need("intermediate_size", 1, 10'000'000);
  s.vocab = c.need("vocab_size", 1, 10'000'000);
  s.max_positions = c.get("max_position_embeddings", d->max_positions, 1, 100'000'000);
  const bool gemma3 = s.model_type == "gemma3_text";
  const bool gemma2 = s.model_type == "gemma2";
  // gemma2 is gemma plus its terms; gemma3_text is gemma2 plus q/k norms and
  // a rotary base of its own for the sliding layers.
  const bool gemma = s.model_type == "gemma" || gemma2 || gemma3;
  s.head_dim = c.get("head_dim", s.model_type == "qwen3" ? 128 : gemma ? 256 : 0, 2, 100'000);
  const bool olmoe = s.model_type == "olmoe";
  if (olmoe && s.head_dim != 0 && s.head_dim * s.n_head != s.n_embd)
    throw std::invalid_argument(c.source + ": \"head_dim\" = " + std::to_string(s.head_dim) +
                                " is not hidden_size / num_attention_heads, which OlmoeAttention "
                                "uses regardless: remove the key");
  s.rope_theta = c.real("rope_theta", gemma3 || s.model_type == "mixtral" ? 1'000'000.0 : 10000.0,
                        1.0, 1e12, false);
  s.rms_eps = c.real("rms_norm_eps", d->rms_eps, 0.0, 1.0);
  s.tie_embeddings = c.flag("tie_word_embeddings", gemma);
  read_sequence_classification(c, s);
  if (s.model_type == "llama" || s.model_type == "qwen3" || s.model_type == "qwen3_moe" || olmoe ||
      gemma)
    s.qkv_bias = s.o_bias = c.flag("attention_bias", false);
  if (s.model_type == "qwen2") s.qkv_bias = true;  // Qwen2 always, and never on o_proj
  if (s.model_type == "qwen2_moe") s.qkv_bias = c.flag("qkv_bias", true);
  if (s.model_type == "phi3") {
    s.fused_projections = true;
    s.partial_rotary = c.real("partial_rotary_factor", 1.0, 0.0, 1.0);
    s.rope_original_max_positions = c.get("original_max_position_embeddings", 4096, 1, 100'000'000);
  }
  if (s.model_type == "llama") s.mlp_bias = c.flag("mlp_bias", false);
  s.qk_norm = s.model_type == "qwen3" || s.model_type == "qwen3_moe" || gemma3;
  s.qk_norm_full = olmoe;
  if (olmoe) s.clip_qkv = c.real("clip_qkv", 0.0, 0.0, 1e12);
  read_experts(c, s);
  s.unit_offset_norm = s.scaled_embeddings = gemma;
  // GemmaConfig's default is 0, the others' None; an explicit null is None.
  s.pad_token_id = c.json.contains("pad_token_id") && c.json["pad_token_id"].is_null()
                       ? -1
                       : c.get("pad_token_id",
                               gemma   ? 0
                               : olmoe ? 1
                                       : -1,
                               0, s.vocab - 1);
  // GemmaMLP reads hidden_act (transformers 4.57); hidden_activation is
  // left unread there, and so here. Gemma2MLP reads hidden_activation only.
  s.act = gemma2 || gemma3 ? c.text("hidden_activation", "gelu_pytorch_tanh")
                           : c.text("hidden_act", gemma ? "gelu_pytorch_tanh" : "silu");
  if (gemma2 || gemma3) {
    s.sandwich_norms = true;
    s.query_pre_attn_scalar = c.real("query_pre_attn_scalar", 256.0, 1e-12, 1e12);
    // null (None) turns a cap off; absent is the config class's default
    // (Gemma 2: 50 and 30; Gemma 3: none, its attention cap refused when set).
    auto cap = [&](const char* key, double fallback) {
      if (c.json.contains(key) && c.json[key].is_null()) return 0.0;
      return c.real(key, fallback, 1e-6, 1e12);
    };
    if (gemma2) s.attn_softcap = cap("attn_logit_softcapping", 50.0);
    s.final_softcap = cap("final_logit_softcapping", gemma2 ? 30.0 : 0.0);
  }
  if (gemma3) s.rope_local_theta = c.real("rope_local_base_freq", 10000.0, 1.0, 1e12, false);
  if (!activation_supported(s.act))
    throw std::invalid_argument(c.source + ": hidden_act \"" + s.act + "\" is not supported (" +
                                kActivations + ")");
  if (c.has("rope_scaling")) read_rope(c, c.json["rope_scaling"], s);
  read_sliding_window(c, s);
  refuse_unsupported(c, s);
  validate(s, c.source);
  return s;
}

void validate(const Shape& s, const std::string& where) {
  auto bad = [&](const std::string& what) { throw std::invalid_argument(where + ": " + what); };
  if (s.n_layer <= 0 || s.n_embd <= 0 || s.n_head <= 0 || s.intermediate <= 0 ||
      s.max_positions <= 0)
    bad("preset \"custom\" needs n_layer, n_embd, n_head, intermediate_size, max_positions");
  if (s.head_dim == 0 && s.n_embd % s.n_head != 0)
    bad("hidden size " + std::to_string(s.n_embd) + " is not a multiple of the " +
        std::to_string(s.n_head) + " heads; give head_dim");
  if (s.d_head() % 2 != 0)
    bad("the head dimension " + std::to_string(s.d_head()) + " must be even (rotary pairs)");
  if (s.n_kv_head <= 0 || s.n_head % s.n_kv_head != 0)
    bad("n_head = " + std::to_string(s.n_head) +
        " is not a multiple of n_kv_head = " + std::to_string(s.n_kv_head));
  if (s.n_head * s.d_head() > 10'000'000) bad("heads x head_dim is past 1e7");
  if (s.pad_token_id >= s.vocab && s.vocab > 0)
    bad("pad_token_id = " + std::to_string(s.pad_token_id) + " is past the vocabulary of " +
        std::to_string(s.vocab));
  if (s.rope_scaling == "yarn" && s.rope_original_max_positions <= 0)
    bad("yarn scaling needs original_max_position_embeddings");
  if (s.rotary_dim() < 2 || s.rotary_dim() % 2 != 0)
    bad("rotary turns " + std::to_string(s.rotary_dim()) +
        " dimensions of each head (head_dim x partial_rotary_factor): it must be even and at "
        "least 2");
  const size_t pairs = static_cast<size_t>(s.rotary_dim() / 2);
  if (s.rope_scaling == "longrope" &&
      (s.longrope_short.size() != pairs || s.longrope_long.size() != pairs))
    bad("longrope needs short_factor and long_factor of " + std::to_string(pairs) +
        " numbers each (rotary dimensions / 2)");
  if (s.rope_scaling == "longrope" && s.model_type != "phi3")
    bad("longrope scaling is read from a phi3 config.json only");
  if (static_cast<int64_t>(s.sliding_layers.size()) < s.n_layer && s.sliding_window > 0)
    bad("the sliding-window layer list is shorter than n_layer");
}

nlohmann::json hf_config_for_export(const Shape& s, const std::string& dtype) {
  const int64_t D = s.d_head();
  nlohmann::json cfg = s.hf_json.is_object() ? s.hf_json : nlohmann::json::object();
  if (!s.hf_json.is_object()) {
    cfg["model_type"] = "llama";
    cfg["architectures"] = {"LlamaForCausalLM"};
    cfg["hidden_act"] = s.act;
    cfg["attention_bias"] = s.qkv_bias;
    cfg["mlp_bias"] = s.mlp_bias;
  }
  if (s.model_type == "qwen2" && !s.hf_json.is_object()) {
    cfg["model_type"] = "qwen2";
    cfg["architectures"] = {"Qwen2ForCausalLM"};
    cfg.erase("attention_bias");
    cfg.erase("mlp_bias");
  }
  cfg["vocab_size"] = s.vocab;
  cfg["hidden_size"] = s.n_embd;
  cfg["intermediate_size"] = s.intermediate;
  cfg["num_hidden_layers"] = s.n_layer;
  cfg["num_attention_heads"] = s.n_head;
  cfg["num_key_value_heads"] = s.n_kv_head;
  cfg["head_dim"] = D;
  cfg["max_position_embeddings"] = s.max_positions;
  cfg["rope_theta"] = s.rope_theta;
  cfg["rms_norm_eps"] = s.rms_eps;
  cfg["tie_word_embeddings"] = s.tie_embeddings;
  cfg["torch_dtype"] = dtype == "fp32" ? "float32" : dtype == "fp16" ? "float16" : "bfloat16";
  cfg.erase("dtype");
  nlohmann::json rope = nullptr;
  if (s.rope_scaling == "linear" || s.rope_scaling == "dynamic")
    rope = {{"rope_type", s.rope_scaling}, {"factor", s.rope_factor}};
  if (s.rope_scaling == "llama3")
    rope = {{"rope_type", "llama3"},
            {"factor", s.rope_factor},
            {"low_freq_factor", s.rope_low_freq_factor},
            {"high_freq_factor", s.rope_high_freq_factor},
            {"original_max_position_embeddings", s.rope_original_max_positions}};
  if (s.rope_scaling == "longrope")  // Phi3Config's three keys
    rope = {
        {"type", "longrope"}, {"short_factor", s.longrope_short}, {"long_factor", s.longrope_long}};
  if (s.rope_scaling == "yarn") {
    rope = {{"rope_type", "yarn"},
            {"factor", s.rope_factor},
            {"original_max_position_embeddings", s.rope_original_max_positions},
            {"beta_fast", s.yarn_beta_fast},
            {"beta_slow", s.yarn_beta_slow},
            {"truncate", s.yarn_truncate}};
    if (s.yarn_attention_factor > 0) rope["attention_factor"] = s.yarn_attention_factor;
    if (s.yarn_mscale != 0) rope["mscale"] = s.yarn_mscale;
    if (s.yarn_mscale_all_dim != 0) rope["mscale_all_dim"] = s.yarn_mscale_all_dim;
  }
  cfg["rope_scaling"] = rope;
  // Written for the Gemmas even where the config gave a pattern instead: it
  // follows an n_layer override, and transformers reads it first.
  if (cfg.contains("layer_types") || s.model_type == "gemma2" || s.model_type == "gemma3_text") {
    nlohmann::json types = nlohmann::json::array();
    for (int64_t l = 0; l < s.n_layer; ++l)
      types.push_back(s.windowed(l) ? "sliding_attention" : "full_attention");
    cfg["layer_types"] = types;
  }
  return cfg;
}

}  // namespace llama
