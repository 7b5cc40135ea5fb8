// The shape of a LLaMA-family decoder (LLaMA 1/2/3, Mistral, Qwen2, Qwen3, Gemma 1/2/3, Phi-3,
// and the mixture-of-experts Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE):
// presets, reading it from a Hugging Face config.json, and writing one back
// for export. Every config.json key that changes the maths is honoured here or
// refused by name; nothing that matters is skipped silently.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace llama {

// The Hugging Face model types this plugin computes.
constexpr const char* kModelTypes =
    "llama,mistral,qwen2,qwen3,gemma,gemma2,gemma3_text,phi3,mixtral,qwen2_moe,qwen3_moe,olmoe";

// How a family names its mixture-of-experts block's weights (Hugging Face).
struct ExpertNames {
  const char* block;             // "mlp" or Mixtral's "block_sparse_moe"
  const char *gate, *up, *down;  // each expert's projections
};

struct Shape {
  std::string model_type = "llama";
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_kv_head = 0, intermediate = 0, vocab = 0,
          max_positions = 0;
  int64_t head_dim = 0;  // 0 = n_embd / n_head
  double rope_theta = 10000.0, rms_eps = 1e-5;
  bool tie_embeddings = false;
  // *ForSequenceClassification (a reward model): the head is `score.weight`,
  // num_labels rows, untied, and there is no lm_head; 0: a causal LM's head.
  int64_t num_labels = 0;
  bool qkv_bias = false;  // q, k, v projections carry biases (Qwen2; attention_bias)
  bool o_bias = false;    // the output projection too (LLaMA's attention_bias)
  bool mlp_bias = false;  // gate, up and down (LLaMA's mlp_bias)
  bool qk_norm = false;   // RMSNorm over each head of q and k before rotary (Qwen3, Gemma 3)
  // Gemma: every RMSNorm scales by (1 + w), in fp32 before the cast back,
  // and the embeddings are multiplied by sqrt(hidden size).
  bool unit_offset_norm = false;
  bool scaled_embeddings = false;
  // Gemma 2: attention scores scaled by query_pre_attn_scalar^-1/2 (0: by
  // head_dim's), attention scores and final logits soft-capped as
  // cap * tanh(x / cap) (0: not), and each sub-layer's output normed before
  // its residual add (post_attention_layernorm on the attention's output,
  // pre_/post_feedforward_layernorm around the MLP).
  double query_pre_attn_scalar = 0.0;
  double attn_softcap = 0.0, final_softcap = 0.0;
  bool sandwich_norms = false;
  // Phi-3: q, k and v in one projection (self_attn.qkv_proj, rows q then k
  // then v), gate and up in one (mlp.gate_up_proj, gate's rows first).
  bool fused_projections = false;
  // The fraction of each head's dimensions rotary turns (Phi-3's
  // partial_rotary_factor); the others pass through.
  double partial_rotary = 1.0;
  // config.json's pad_token_id: transformers' nn.Embedding(padding_idx) gives
  // that row no gradient from lookups (-1: none).
  int64_t pad_token_id = -1;
  std::string act = "silu";
  // Rotary scaling: none | linear | dynamic | llama3 | yarn | longrope.
  std::string rope_scaling = "none";
  double rope_factor = 1.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int64_t rope_original_max_positions = 8192;
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  double yarn_attention_factor = 0.0;  // 0 = from factor (and mscale, mscale_all_dim)
  double yarn_mscale = 0.0, yarn_mscale_all_dim = 0.0;
  bool yarn_truncate = true;
  // LongRoPE (Phi-3): per-frequency divisors, the long ones for a pass whose
  // positions reach past rope_original_max_positions, the short ones else.
  std::vector<double> longrope_short, longrope_long;
  // Gemma 3: the sliding layers rotate by their own base (rope_local_base_freq),
  // unscaled; rope_theta and rope_scaling are the full layers'. 0 = one rotary.
  double rope_local_theta = 0.0;
  // Sliding-window attention: a query sees the `sliding_window` latest keys
  // (itself included) in the layers flagged here; 0 = no window.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  nlohmann::json hf_json;  // the config.json read, kept for export (null for presets)

  // Mixture of experts: the blocks has_experts() names replace the MLP by
  // n_experts MLPs of expert_intermediate each; a router (`gate`, no bias)
  // scores every expert per token, softmax in fp32, the top_k are run and
  // their outputs summed weighted by those probabilities (renormalized to sum
  // 1 when norm_topk). Qwen2-MoE adds a shared expert (shared_intermediate > 0)
  // every token runs, scaled by sigmoid(shared_expert_gate x). 0 = dense.
  int64_t n_experts = 0, top_k = 0, expert_intermediate = 0, shared_intermediate = 0;
  bool norm_topk = false;
  // output_router_logits: the loss gains router_aux_coef times the routers'
  // load-balancing loss (router_balance.hpp); 0 = not added.
  double router_aux_coef = 0;
  // Qwen2/3-MoE: experts in layers l with (l + 1) % sparse_step == 0 that
  // dense_layers (mlp_only_layers) does not list; a dense MLP in the others.
  int64_t sparse_step = 1;
  std::vector<int64_t> dense_layers;
  // OLMoE: q and k RMS-normalized over all heads at once (q_norm [H D],
  // k_norm [KVH D]) before the heads are split, and q, k, v clamped to
  // [-clip_qkv, clip_qkv] after (0 = not).
  bool qk_norm_full = false;
  double clip_qkv = 0.0;

  int64_t d_head() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  // transformers' int(head_dim * partial_rotary_factor).
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(d_head()) * partial_rotary);
  }
  bool windowed(int64_t layer) const {
    return sliding_window > 0 && layer < static_cast<int64_t>(sliding_layers.size()) &&
           sliding_layers[static_cast<size_t>(layer)];
  }
  bool local_rope(int64_t layer) const { return rope_local_theta > 0 && windowed(layer); }
  // Layer `layer`'s attention over T tokens needs a window or capped scores,
  // which LibTorch's kernels would take as [T, T] (a long pass attends in
  // tiles instead: Llama::attend, and the plan's bytes for it).
  bool masked_or_capped(int64_t layer, int64_t T) const {
    return attn_softcap > 0 || (windowed(layer) && sliding_window < T);
  }
  bool has_experts(int64_t layer) const {
    if (n_experts <= 0 || (layer + 1) % sparse_step != 0) return false;
    for (int64_t d : dense_layers)
      if (d == layer) return false;
    return true;
  }
  ExpertNames expert_names() const {
    if (model_type == "mixtral") return {"block_sparse_moe", "w1", "w3", "w2"};
    return {"mlp", "gate_proj", "up_proj", "down_proj"};
  }
};

struct Preset {
  const char* name;
  Shape shape;
};
const std::vector<Preset>& presets();

// Reads and validates a config.json (file or model folder). Throws
// std::invalid_argument naming the file, the key and the fix.
Shape shape_from_hf_config(const std::string& path);

// Checks the (possibly overridden) shape hangs together; `where` names its origin.
void validate(const Shape& s, const std::string& where);

// The config.json transformers needs to load the model back: the one read,
// with the effective values written over it, or a LLaMA one for presets.
nlohmann::json hf_config_for_export(const Shape& s, const std::string& dtype);

}  // namespace llama
