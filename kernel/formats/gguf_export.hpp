// A model and a LoRA adapter written as GGUF, as llama.cpp's
// convert_hf_to_gguf.py and convert_lora_to_gguf.py write them, so that
// llama.cpp, ollama and LM Studio load what tightfit trained:
// - the metadata of the architecture (llama — which Mistral, Mixtral and
//   SmolLM use —, qwen2, qwen3, olmoe, qwen2moe, qwen3moe) from config.json;
// - a mixture of experts' routed experts stacked per layer and projection
//   (gguf_experts.hpp), its routers and shared expert under llama.cpp's names;
// - each tensor under its GGUF name (gguf_model's map), LLaMA's q and k rows
//   permuted for llama.cpp's rotary kernel;
// - norms and biases in F32, the matrices in the type asked for (F32, F16,
//   BF16, Q8_0; a matrix whose rows do not fill Q8_0 blocks in F16, as the
//   converter does, with a warning);
// - the tokenizer: the tokenizer.* keys of the GGUF file the model came
//   from, copied as they were, or converted from a Hugging Face byte-level
//   BPE tokenizer (write_tokenizer_keys).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "gguf_experts.hpp"
#include "gguf_file.hpp"
#include "gguf_writer.hpp"

namespace tightfit::gguf {

// The output type named as llama.cpp's converters name it (--outtype):
// "f32", "f16", "bf16", "q8_0". Throws GgufError for another name.
const TensorType& out_type(const std::string& name);

// The GGUF architecture config.json's model_type converts to (mistral and
// mixtral -> llama, as convert_hf_to_gguf). Throws GgufError naming the model_type
// and the ones written.
std::string gguf_architecture(const nlohmann::json& config);

// The tokenizer.* keys for a model whose tokenizer tightfit read from
// `tokenizer_source_file`: a tokenizer converted from a GGUF file (a folder
// gguf_folder wrote) gets that file's keys, unchanged; a Hugging Face
// byte-level BPE tokenizer.json is converted (gguf_tokenizer_export). Throws
// GgufError saying why for any other (the byte tokenizer, SentencePiece).
void write_tokenizer_keys(const std::string& tokenizer_source_file, GgufWriter& out);

// Writes a merged model: construct, add() every tensor in Hugging Face's
// names and layout, finish().
class GgufModelWriter {
 public:
  GgufModelWriter(const std::string& path, const nlohmann::json& config, const TensorType& type,
                  const std::string& tokenizer_source_file, const std::string& model_name);
  // Logs (through `warn`) a matrix written in F16 instead of Q8_0.
  void add(const std::string& hf_name, const at::Tensor& t,
           const std::function<void(const std::string&)>& warn = {});
  void finish();

 private:
  // Encodes one tensor under its GGUF name, in the file's type or F32.
  void add_matrix(const std::string& name, const at::Tensor& w, const std::string& hf_name,
                  const std::function<void(const std::string&)>& warn);

  nlohmann::json config_;
  std::string arch_;
  const TensorType& type_;
  GgufWriter out_;
  ExpertStacks experts_;
};

// Writes the PEFT adapter folder `peft_dir` (adapter_config.json +
// adapter_model.safetensors) as a llama.cpp LoRA adapter: general.type
// "adapter", adapter.type "lora", adapter.lora.alpha, and per adapted
// weight W its "W.lora_a" ([r, in]) and "W.lora_b" ([out, r], q and k rows
// permuted for llama). rsLoRA's scale alpha / sqrt(r) is written as the alpha
// that llama.cpp's alpha / r makes it. `config` is the base model's.
void write_lora_adapter(const std::string& peft_dir, const nlohmann::json& config,
                        const std::string& path, const TensorType& type,
                        const std::string& model_name);

}  // namespace tightfit::gguf
