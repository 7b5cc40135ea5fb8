#include "gguf_experts.hpp"

#include <regex>

#include "gguf_file.hpp"
#include "json_input.hpp"
#include "model_families.hpp"

namespace tightfit::gguf {
namespace {

int64_t required_int(const nlohmann::json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_number_integer() || c[key].get<int64_t>() <= 0)
    throw GgufError(std::string("config.json has no positive integer ") + key +
                    ", which a mixture of experts' GGUF metadata needs");
  return c[key].get<int64_t>();
}

}  // namespace

const ModelFamily* routed_family(const nlohmann::json& config) {
  const ModelFamily* f = family_of_model_type(config.value("model_type", ""));
  return f != nullptr && f->experts != ExpertLayout::kNone ? f : nullptr;
}

bool routes_experts(const nlohmann::json& config) {
  return routed_family(config) != nullptr;
}

int64_t routed_expert_count(const nlohmann::json& config) {
  const ModelFamily* f = routed_family(config);
  return f == nullptr ? 0 : required_int(config, f->expert_count_key);
}

std::optional<ExpertName> expert_name(const std::string& hf_name) {
  // Mixtral's w1, w3, w2 are the others' gate, up and down projections.
  static const std::regex expert(
      R"(model\.layers\.(\d+)\.(?:mlp\.experts\.(\d+)\.(gate|up|down)_proj|)"
      R"(block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3))\.weight)");
  std::smatch m;
  if (!std::regex_match(hf_name, m, expert)) return std::nullopt;
  const bool mixtral = m[4].matched;
  const std::string index = mixtral ? m[4].str() : m[2].str();
  // An index past nine digits is no model's (and would overflow stoll).
  if (index.size() > 9) return std::nullopt;
  const std::string w = m[5].str();
  const std::string projection = !mixtral    ? m[3].str()
                                 : w == "w1" ? "gate"
                                 : w == "w3" ? "up"
                                             : "down";
  const std::string prefix = "blk." + m[1].str() + ".ffn_" + projection;
  return ExpertName{std::stoll(index), prefix + "_exps.weight", prefix + "." + index + ".weight"};
}

void write_expert_keys(const nlohmann::json& config, const std::string& arch, GgufWriter& out) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw GgufError("config.json's " + key + " " +
                    (config.contains(key) ? json_excerpt(config[key]) : std::string("(unset)")) +
                    ": " + why +
                    "; export a Hugging Face folder (--format hf) and convert it with llama.cpp's "
                    "convert_hf_to_gguf.py if your llama.cpp reads it");
  };
  const std::string a = arch + ".";
  const ModelFamily* family = routed_family(config);
  if (family == nullptr) return;
  // convert_hf_to_gguf writes Mixtral's and OLMoE's counts only (their
  // experts are intermediate_size wide: feed_forward_length).
  auto write_counts = [&] {
    out.set_u32(a + "expert_count", static_cast<uint32_t>(routed_expert_count(config)));
    out.set_u32(a + "expert_used_count",
                static_cast<uint32_t>(required_int(config, "num_experts_per_tok")));
  };
  auto is_set = [&](const char* key) {
    return config.contains(key) && !config[key].is_null() &&
           !(config[key].is_number() && config[key].get<double>() == 0.0);
  };
  if (family->experts == ExpertLayout::kMixtral) {
    // llama.cpp's llama graph routes every layer and normalizes the chosen
    // experts' weights, as Mixtral does; it has no sliding window.
    if (is_set("sliding_window"))
      refuse("sliding_window", "llama.cpp's llama graph attends to every position");
    write_counts();
    return;
  }
  if (family->experts == ExpertLayout::kOlmoe) {
    // llama.cpp's olmoe graph: q and k normed over all heads ({n_embd}
    // each, so as many key heads as query heads), no clipping, the top-k
    // weights not normalized.
    if (is_set("clip_qkv")) refuse("clip_qkv", "llama.cpp's olmoe graph does not clip q, k, v");
    if (config.value("num_key_value_heads", config.value("num_attention_heads", 0)) !=
        config.value("num_attention_heads", 0))
      refuse("num_key_value_heads",
             "llama.cpp's olmoe graph has as many key and value heads as query heads");
    if (config.value("norm_topk_prob", false))
      refuse("norm_topk_prob", "llama.cpp's olmoe does not normalize the top-k weights");
    write_counts();
    return;
  }
  // llama.cpp's qwen2moe and qwen3moe graphs give every layer experts.
  if (config.contains("mlp_only_layers") && !config["mlp_only_layers"].is_null() &&
      !(config["mlp_only_layers"].is_array() && config["mlp_only_layers"].empty()))
    refuse("mlp_only_layers", "llama.cpp's " + arch + " gives every layer experts");
  if (config.contains("decoder_sparse_step") && config["decoder_sparse_step"] != 1)
    refuse("decoder_sparse_step", "llama.cpp's " + arch + " gives every layer experts");
  // Its graph normalizes the chosen experts' weights for qwen3moe and not
  // for qwen2moe, whatever the file says.
  const bool normalized = family->normalized_topk;
  if (config.value("norm_topk_prob", false) != normalized)
    refuse("norm_topk_prob", std::string("llama.cpp's ") + arch +
                                 (normalized ? " normalizes" : " does not normalize") +
                                 " the top-k weights");
  write_counts();
  out.set_u32(a + "expert_feed_forward_length",
              static_cast<uint32_t>(required_int(config, "moe_intermediate_size")));
  if (family->shared_expert)
    out.set_u32(a + "expert_shared_feed_forward_length",
                static_cast<uint32_t>(required_int(config, "shared_expert_intermediate_size")));
}

bool ExpertStacks::add(const std::string& hf_name, const at::Tensor& t,
                       std::optional<std::pair<std::string, at::Tensor>>* stacked) {
  const std::optional<ExpertName> expert = expert_name(hf_name);
  if (!expert) return false;
  const int64_t index = expert->index;
  if (index >= n_)
    throw GgufError("the model's tensor " + hf_name + " is expert " + std::to_string(index) +
                    " of " + std::to_string(n_) + " (config.json's num_experts)");
  const std::string& name = expert->stack;
  std::vector<at::Tensor>& experts = partial_[name];
  experts.resize(static_cast<size_t>(n_));
  at::Tensor& slot = experts[static_cast<size_t>(index)];
  if (slot.defined()) throw GgufError("the model gives " + hf_name + " twice");
  slot = t.detach().to(at::kFloat);
  for (const at::Tensor& e : experts)
    if (!e.defined()) return true;
  stacked->emplace(name, at::stack(experts));
  partial_.erase(name);
  return true;
}

void ExpertStacks::check_complete() const {
  for (const auto& [name, experts] : partial_) {
    int64_t missing = 0;
    for (const at::Tensor& e : experts) missing += e.defined() ? 0 : 1;
    throw GgufError(name + " misses " + std::to_string(missing) + " of its " + std::to_string(n_) +
                    " experts: the model gave only some of them");
  }
}

}  // namespace tightfit::gguf
