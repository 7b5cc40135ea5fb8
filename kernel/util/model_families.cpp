#include "model_families.hpp"

#include <algorithm>

namespace tightfit {
namespace {

// "a, b and c"
std::string listed(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? " and " : ", ";
    out += items[i];
  }
  return out;
}

}  // namespace

const std::vector<ModelFamily>& model_families() {
  using E = ExpertLayout;
  static const std::vector<ModelFamily> kFamilies = {
      {.model_type = "llama",
       .tokenizer_class = "LlamaTokenizer",
       .gguf_writes = "llama",
       .gguf_reads = "llama",
       .rope_dimension_count = true,
       .permuted_qk = true},
      // convert_hf_to_gguf writes Mistral as llama; a file of llama.cpp's
      // mistral architecture (written unpermuted) reads as mistral.
      {.model_type = "mistral",
       .tokenizer_class = "LlamaTokenizer",
       .gguf_writes = "llama",
       .gguf_reads = "mistral",
       .rope_dimension_count = true},
      {.model_type = "mixtral",
       .tokenizer_class = "LlamaTokenizer",
       .gguf_writes = "llama",
       .gguf_reads = "llama",
       .rope_dimension_count = true,
       .permuted_qk = true,
       .experts = E::kMixtral,
       .expert_count_key = "num_local_experts",
       .normalized_topk = true},
      {.model_type = "qwen2",
       .tokenizer_class = "Qwen2Tokenizer",
       .gguf_writes = "qwen2",
       .gguf_reads = "qwen2"},
      {.model_type = "qwen3",
       .tokenizer_class = "Qwen2Tokenizer",
       .gguf_writes = "qwen3",
       .gguf_reads = "qwen3"},
      {.model_type = "olmoe",
       .tokenizer_class = "GPTNeoXTokenizer",
       .gguf_writes = "olmoe",
       .gguf_reads = "olmoe",
       .experts = E::kOlmoe,
       .expert_count_key = "num_experts"},
      {.model_type = "qwen2_moe",
       .tokenizer_class = "Qwen2Tokenizer",
       .gguf_writes = "qwen2moe",
       .gguf_reads = "qwen2moe",
       .experts = E::kQwenMoe,
       .expert_count_key = "num_experts",
       .shared_expert = true},
      {.model_type = "qwen3_moe",
       .tokenizer_class = "Qwen2Tokenizer",
       .gguf_writes = "qwen3moe",
       .gguf_reads = "qwen3moe",
       .experts = E::kQwenMoe,
       .expert_count_key = "num_experts",
       .normalized_topk = true},
      {.model_type = "gemma", .tokenizer_class = "GemmaTokenizer"},
      {.model_type = "gemma2", .tokenizer_class = "GemmaTokenizer"},
      {.model_type = "gemma3_text", .tokenizer_class = "GemmaTokenizer"},
      {.model_type = "phi3", .tokenizer_class = "LlamaTokenizer"},
      {.model_type = "gpt2", .tokenizer_class = "GPT2Tokenizer"},
      {.model_type = "gpt_neox", .tokenizer_class = "GPTNeoXTokenizer"},
  };
  return kFamilies;
}

const ModelFamily* family_of_model_type(const std::string& model_type) {
  for (const ModelFamily& f : model_families())
    if (model_type == f.model_type) return &f;
  return nullptr;
}

const ModelFamily* family_of_gguf(const std::string& arch, bool expert_count) {
  const ModelFamily *dense = nullptr, *routed = nullptr;
  for (const ModelFamily& f : model_families())
    if (f.gguf_reads != nullptr && arch == f.gguf_reads)
      (f.experts == ExpertLayout::kNone ? dense : routed) = &f;
  return routed != nullptr && (expert_count || dense == nullptr) ? routed : dense;
}

std::string gguf_read_architectures() {
  std::vector<std::string> archs;
  for (const ModelFamily& f : model_families()) {
    if (f.gguf_reads != nullptr &&
        std::find(archs.begin(), archs.end(), f.gguf_reads) == archs.end())
      archs.emplace_back(f.gguf_reads);
  }
  return listed(archs);
}

std::string gguf_expert_architectures() {
  std::vector<std::string> archs;
  for (const ModelFamily& f : model_families())
    if (f.gguf_reads != nullptr && f.experts != ExpertLayout::kNone)
      archs.push_back(std::string(f.gguf_reads) + " (" + f.model_type + ")");
  return listed(archs);
}

std::string gguf_written_model_types() {
  std::vector<std::string> types;
  for (const ModelFamily& f : model_families())
    if (f.gguf_writes != nullptr) types.emplace_back(f.model_type);
  return listed(types);
}

}  // namespace tightfit
