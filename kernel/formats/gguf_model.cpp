#include "gguf_model.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <utility>

#include "gguf_experts.hpp"
#include "model_families.hpp"

namespace tightfit::gguf {
namespace {

std::string architecture(const GgufReader& file) {
  return file.get("general.architecture").as_string("general.architecture");
}

bool routes_experts(const ModelFamily& family) {
  return family.experts != ExpertLayout::kNone;
}

// A mixture of experts' keys (convert_hf_to_gguf's), and what llama.cpp's
// graphs assume without a key: experts in every layer, the chosen experts'
// weights normalized for qwen3moe and Mixtral only, Mixtral's and OLMoE's
// experts feed_forward_length wide. transformers' GGUF loader reads neither
// moe_intermediate_size nor norm_topk_prob; llama.cpp, which defines these
// files, computes with both.
void expert_config(const GgufReader& file, const std::string& arch, const ModelFamily& family,
                   nlohmann::json& c) {
  std::vector<std::pair<const char*, const char*>> keys = {
      {"expert_count", family.expert_count_key}, {"expert_used_count", "num_experts_per_tok"}};
  if (family.experts == ExpertLayout::kQwenMoe)
    keys.emplace_back("expert_feed_forward_length", "moe_intermediate_size");
  if (family.shared_expert)
    keys.emplace_back("expert_shared_feed_forward_length", "shared_expert_intermediate_size");
  for (const auto& [gguf_key, hf_key] : keys) {
    const std::string key = arch + "." + gguf_key;
    const Value* v = file.find(key);
    if (v == nullptr)
      throw GgufError(file.path() + ": the metadata gives no " + key +
                      ", which a mixture of experts needs (the file is not llama.cpp's)");
    c[hf_key] = v->as_int(key);
  }
  // Mixtral always normalizes, and routes every layer.
  if (family.experts == ExpertLayout::kMixtral) return;
  c["norm_topk_prob"] = family.normalized_topk;
  if (family.experts == ExpertLayout::kOlmoe) return;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = nlohmann::json::array();
}

}  // namespace

bool looks_like_gguf(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".gguf") return true;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;  // never opens a FIFO
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

bool is_supported_architecture(const std::string& arch) {
  return family_of_gguf(arch, false) != nullptr;
}

nlohmann::json hf_config(const GgufReader& file) {
  const std::string arch = architecture(file);
  // The family (util/model_families.hpp): of those that read the
  // architecture, the one with experts when the file counts some (a llama
  // with experts is Mixtral, as convert_hf_to_gguf writes it).
  const std::string count_key = arch + ".expert_count";
  const Value* count = file.find(count_key);
  const int64_t experts = count != nullptr ? count->as_int(count_key) : 0;
  const ModelFamily* family = family_of_gguf(arch, experts > 0);
  if (family == nullptr)
    throw GgufError(file.path() + ": general.architecture is \"" + arch +
                    "\"; tightfit reads GGUF models of the " + gguf_read_architectures() +
                    " architectures (a llama with experts is Mixtral)");
  // An expert_count where the architecture's family has no experts: its
  // experts would be missing tensors, without saying why.
  if (!routes_experts(*family) && experts > 0)
    throw GgufError(file.path() + ": " + count_key + " is " + std::to_string(experts) +
                    ": a mixture of experts tightfit reads only as " + gguf_expert_architectures() +
                    ": train from the model's Hugging Face folder ([model] weights = "
                    "\"folder\")");
  nlohmann::json c;
  c["model_type"] = family->model_type;
  // GGUF_CONFIG_MAPPING: "<arch>.<key>" -> config.json's key.
  const std::pair<const char*, const char*> ints[] = {
      {"context_length", "max_position_embeddings"},
      {"block_count", "num_hidden_layers"},
      {"feed_forward_length", "intermediate_size"},
      {"embedding_length", "hidden_size"},
      {"attention.head_count", "num_attention_heads"},
      {"attention.head_count_kv", "num_key_value_heads"},
      {"vocab_size", "vocab_size"},
  };
  for (const auto& [gguf_key, hf_key] : ints) {
    const std::string key = arch + "." + gguf_key;
    if (const Value* v = file.find(key)) c[hf_key] = v->as_int(key);
  }
  // Checked here, where they enter: a NaN would be written into config.json
  // as null, and the model plugin would then train with its default.
  for (const auto& [gguf_key, hf_key] :
       {std::pair{"rope.freq_base", "rope_theta"},
        std::pair{"attention.layer_norm_rms_epsilon", "rms_norm_eps"}}) {
    const std::string key = arch + "." + gguf_key;
    if (const Value* v = file.find(key)) {
      const double x = v->as_number(key);
      if (!std::isfinite(x) || x <= 0)
        throw GgufError(file.path() + ": " + key + " is " + std::to_string(x) +
                        ": it must be a positive finite number (the rope base, the norm's "
                        "epsilon); the file's metadata is damaged: use another copy of the model");
      c[hf_key] = x;
    }
  }
  // rope.dimension_count is head_dim for llama and mistral only; the
  // others say it as the keys' length (transformers' qwen3 mapping).
  const std::string head_dim_key =
      arch + (family->rope_dimension_count ? ".rope.dimension_count" : ".attention.key_length");
  if (const Value* v = file.find(head_dim_key)) c["head_dim"] = v->as_int(head_dim_key);
  if (routes_experts(*family)) expert_config(file, arch, *family, c);
  for (const char* required : {"num_hidden_layers", "hidden_size", "num_attention_heads"})
    if (!c.contains(required))
      throw GgufError(file.path() + ": the metadata gives no " + required + " (" + arch +
                      ".block_count, .embedding_length, .attention.head_count are required)");
  // A file without a vocab_size key: the number of tokens (as llama.cpp).
  if (!c.contains("vocab_size"))
    if (const Value* t = file.find("tokenizer.ggml.tokens"))
      c["vocab_size"] = static_cast<int64_t>(t->as_array("tokenizer.ggml.tokens").size());
  c["tie_word_embeddings"] = file.find_tensor("output.weight") == nullptr;
  for (const auto& [gguf_key, hf_key] :
       {std::pair{"bos_token_id", "bos_token_id"}, std::pair{"eos_token_id", "eos_token_id"},
        std::pair{"unknown_token_id", "unk_token_id"},
        std::pair{"padding_token_id", "pad_token_id"}}) {
    const std::string key = std::string("tokenizer.ggml.") + gguf_key;
    if (const Value* v = file.find(key)) c[hf_key] = v->as_int(key);
  }
  return c;
}

std::optional<std::string> gguf_tensor_name(const std::string& hf_name) {
  static const std::pair<const char*, const char*> whole[] = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  for (const auto& [hf, gg] : whole)
    if (hf_name == hf) return std::string(gg);
  static const std::pair<const char*, const char*> in_block[] = {
      {"input_layernorm", "attn_norm"},
      {"post_attention_layernorm", "ffn_norm"},
      {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"},
      {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"},
      {"mlp.gate_proj", "ffn_gate"},
      {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},
      // The routers (Mixtral's, and the others'), Qwen2-MoE's shared
      // expert (the routed experts are stacked: gguf_experts.hpp).
      {"block_sparse_moe.gate", "ffn_gate_inp"},
      {"mlp.gate", "ffn_gate_inp"},
      {"mlp.shared_expert_gate", "ffn_gate_inp_shexp"},
      {"mlp.shared_expert.gate_proj", "ffn_gate_shexp"},
      {"mlp.shared_expert.up_proj", "ffn_up_shexp"},
      {"mlp.shared_expert.down_proj", "ffn_down_shexp"},
  };
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+)\.(weight|bias))");
  std::smatch m;
  if (!std::regex_match(hf_name, m, layer)) return std::nullopt;
  for (const auto& [hf, gg] : in_block)
    if (m[2] == hf) return "blk." + m[1].str() + "." + gg + "." + m[3].str();
  return std::nullopt;
}

namespace {

// llama.cpp's converter permutes q and k rows per head, [n_head, 2, dim/2]
// -> [n_head, dim/2, 2] (convert_hf_to_gguf's LlamaModel.permute): undone
// as transformers' LlamaTensorProcessor undoes it, for architecture llama.
// `w` is [rows, ...]: the values, or each row's stored blocks (a block
// never spans two rows, so moving rows moves whole blocks).
at::Tensor undo_qk_permutation(const GgufReader& file, const nlohmann::json& config,
                               const std::string& name, at::Tensor w) {
  const bool q = name.find(".attn_q.") != std::string::npos;
  const bool k = name.find(".attn_k.") != std::string::npos;
  const ModelFamily* family = family_of_model_type(config.value("model_type", ""));
  if (family == nullptr || !family->permuted_qk || !(q || k) ||
      !config.contains("num_attention_heads") || !config.contains("num_key_value_heads"))
    return w;
  const int64_t n_head = q ? config["num_attention_heads"].get<int64_t>()
                           : config["num_key_value_heads"].get<int64_t>();
  const int64_t rows = w.size(0);
  if (n_head <= 0 || rows % (2 * n_head) != 0)
    throw GgufError(file.path() + ": " + name + " has " + std::to_string(rows) +
                    " rows, not a multiple of 2 x " + std::to_string(n_head) + " heads");
  std::vector<int64_t> split{n_head, rows / n_head / 2, 2};
  const auto rest = w.sizes().slice(1);
  split.insert(split.end(), rest.begin(), rest.end());
  return w.reshape(split).transpose(1, 2).reshape(w.sizes()).contiguous();
}

// A routed expert's part of its layer's stack [n, out, in]: the n-th
// share of the stack's bytes, as a matrix [out, in] of its own.
TensorInfo expert_slice(const GgufReader& file, const TensorInfo& stack, int64_t index,
                        const std::string& hf_name) {
  if (stack.dims.size() != 3 || index >= stack.dims[2])
    throw GgufError(file.path() + ": " + stack.name + " holds no expert " + std::to_string(index) +
                    " for " + hf_name + " (it is " + std::to_string(stack.dims.size()) +
                    "-dimensional, " + std::to_string(stack.dims.size() == 3 ? stack.dims[2] : 0) +
                    " experts)");
  const int64_t n = stack.dims[2];
  TensorInfo t = stack;
  t.name = stack.name + "[" + std::to_string(index) + "]";
  t.dims = {stack.dims[0], stack.dims[1]};
  t.numel = stack.numel / n;
  t.bytes = stack.bytes / static_cast<uint64_t>(n);
  t.offset = stack.offset + t.bytes * static_cast<uint64_t>(index);
  return t;
}

TensorInfo hf_tensor_info(const GgufReader& file, const std::string& hf_name,
                          std::string& gguf_name) {
  if (const std::optional<ExpertName> expert = expert_name(hf_name)) {
    if (const TensorInfo* stack = file.find_tensor(expert->stack)) {
      gguf_name = expert->stack;
      return expert_slice(file, *stack, expert->index, hf_name);
    }
    // A file from before llama.cpp stacked the experts: one tensor each.
    if (const TensorInfo* single = file.find_tensor(expert->single)) {
      gguf_name = expert->single;
      return *single;
    }
    throw GgufError(file.path() + ": no tensor for " + hf_name + " (looked for " + expert->stack +
                    " and " + expert->single + ")");
  }
  const std::optional<std::string> name = gguf_tensor_name(hf_name);
  const TensorInfo* t = name ? file.find_tensor(*name) : nullptr;
  if (!t)
    throw GgufError(file.path() + ": no tensor for " + hf_name +
                    (name ? " (looked for " + *name + ")" : std::string(" (no GGUF name for it)")));
  gguf_name = *name;
  // Qwen2-MoE's shared-expert gate is a vector in llama.cpp, [1, hidden]
  // in transformers.
  if (name->ends_with(".ffn_gate_inp_shexp.weight") && t->dims.size() == 1) {
    TensorInfo row = *t;
    row.dims = {t->dims[0], 1};
    return row;
  }
  return *t;
}

}  // namespace

at::Tensor read_hf_tensor(const GgufReader& file, const nlohmann::json& config,
                          const std::string& hf_name) {
  std::string name;
  const TensorInfo t = hf_tensor_info(file, hf_name, name);
  return undo_qk_permutation(file, config, name, file.read_float(t));
}

HfBlocks read_hf_blocks(const GgufReader& file, const nlohmann::json& config,
                        const std::string& hf_name, bool with_bytes) {
  std::string name;
  const TensorInfo t = hf_tensor_info(file, hf_name, name);
  if (t.dims.size() != 2)
    throw GgufError(file.path() + ": " + name +
                    " is not a matrix; only matrices keep their blocks");
  HfBlocks b;
  b.type = t.type;
  b.rows = t.dims[1];
  b.cols = t.dims[0];
  b.row_bytes = b.cols / t.type->block * t.type->bytes;
  if (with_bytes)
    b.bytes = undo_qk_permutation(file, config, name, file.read_raw(t).view({b.rows, b.row_bytes}));
  return b;
}

}  // namespace tightfit::gguf
