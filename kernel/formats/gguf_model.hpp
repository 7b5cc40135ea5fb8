// A GGUF file seen as a Hugging Face checkpoint, as transformers' GGUF
// loader (modeling_gguf_pytorch_utils, 4.57) sees it: the config.json its
// metadata makes, the Hugging Face name of each tensor, and the tensors in
// Hugging Face's layout (llama.cpp's converter permutes the rows of LLaMA's
// q and k projections for its rotary kernel; that permutation is undone).
#pragma once

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "gguf_file.hpp"

namespace tightfit::gguf {

// Whether `path` is a GGUF file: named *.gguf, or a regular file that
// starts with GGUF's magic.
bool looks_like_gguf(const std::string& path);

// The architectures read: general.architecture llama (LLaMA, Mistral and
// SmolLM files use it), mistral, qwen2, qwen3. Another is refused by name.
bool is_supported_architecture(const std::string& arch);

// config.json as transformers builds it from the metadata: model_type, the
// sizes (GGUF_CONFIG_MAPPING), tie_word_embeddings (no output.weight
// tensor), and the special token ids. Throws GgufError naming a missing
// key or an unsupported architecture.
nlohmann::json hf_config(const GgufReader& file);

// The GGUF tensor holding a Hugging Face parameter (model.layers.3.mlp.
// gate_proj.weight -> blk.3.ffn_gate.weight); nullopt for a name with none.
std::optional<std::string> gguf_tensor_name(const std::string& hf_name);

// The Hugging Face tensor `hf_name` as float32 in its Hugging Face shape,
// the q/k permutation undone for llama. Throws GgufError when the file has
// no such tensor.
at::Tensor read_hf_tensor(const GgufReader& file, const nlohmann::json& config,
                          const std::string& hf_name);

// A Hugging Face matrix as the file stores it: its ggml type and, per row,
// the row's blocks (uint8 [rows, row_bytes], CPU), rows in Hugging Face's
// order (the q/k permutation undone on whole rows). `bytes` is left
// undefined when not asked for (sizes only, for a plan).
struct HfBlocks {
  const TensorType* type = nullptr;
  int64_t rows = 0, cols = 0, row_bytes = 0;
  at::Tensor bytes;
};
HfBlocks read_hf_blocks(const GgufReader& file, const nlohmann::json& config,
                        const std::string& hf_name, bool with_bytes);

}  // namespace tightfit::gguf
