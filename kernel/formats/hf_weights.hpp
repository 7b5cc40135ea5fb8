// Weights with Hugging Face names: import into the parameter store (and the
// inverse for export), transposing the weights a model flags as stored
// [in, out] by Hugging Face (TF_PARAM_HF_TRANSPOSED).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "param_store.hpp"
#include "safetensors.hpp"

namespace tightfit {
namespace gguf {
class GgufReader;
struct HfBlocks;
}  // namespace gguf

// Hugging Face weights to start from: a .safetensors file, a folder
// holding model.safetensors or sharded model-0000x-of-0000y.safetensors with
// model.safetensors.index.json, or a GGUF file (its tensors dequantized
// under their Hugging Face names, as transformers' GGUF loader reads them). Headers are read and
// validated when opened; tensors one at a time, so a model loads stage by stage.
class HfWeightSource {
 public:
  explicit HfWeightSource(const std::string& path);
  // Copies the parameter's tensor into p.value, transposing weights flagged
  // TF_PARAM_HF_TRANSPOSED. A name may also be found without a leading
  // "<prefix>." (original GPT-2 files omit "transformer."). Throws
  // std::runtime_error naming a missing or mis-shaped tensor.
  void load(Param& p) const;
  // The parameter as a GGUF file stores it (gguf_model.hpp's HfBlocks, the
  // bytes only when `with_bytes`): for a strategy that keeps the file's
  // own quantized blocks. Throws std::runtime_error when the source is not
  // a GGUF file, has no such matrix, or its shape is not the parameter's.
  gguf::HfBlocks blocks(const Param& p, bool with_bytes) const;
  bool is_gguf() const { return gguf_ != nullptr; }
  const std::string& source() const { return source_; }

 private:
  std::string source_;  // the file or index named in messages
  std::vector<SafetensorsReader> readers_;
  std::map<std::string, size_t> where_;           // tensor name -> reader
  std::shared_ptr<const gguf::GgufReader> gguf_;  // a GGUF file instead of safetensors
  nlohmann::json gguf_config_;                    // its config.json (q/k un-permuted by it)
};

// Loads every parameter of `store` except adapters from `path`.
void load_hf_weights(ParamStore& store, const std::string& path);

// Writes a folder transformers' from_pretrained loads: model.safetensors
// (Hugging Face names and layouts), config.json, and tokenizer.json when given.
void save_hf_model(const ParamStore& store, const std::string& dir, const std::string& config_json,
                   const std::string& tokenizer_json_path,
                   const std::function<at::Tensor(const Param&)>& dense = nullptr);

// Beside the weights: config.json, and the tokenizer's file (a tokenizer.json,
// or the vocab.json + merges.txt or tokenizer.model it was converted from)
// with the files transformers reads next to it (tokenizer_config.json,
// special_tokens_map.json, added_tokens.json, chat_template.jinja,
// generation_config.json) when its folder has them.
void write_hf_side_files(const std::string& dir, const std::string& config_json,
                         const std::string& tokenizer_json_path);

// A parameter's value in Hugging Face's layout (transposed when flagged).
at::Tensor hf_layout(const Param& p, at::Tensor t);

// The store's parameters under Hugging Face names and layouts; `dense` gives
// the dense value of a parameter stored in a compact format.
std::map<std::string, at::Tensor> export_hf_weights(
    const ParamStore& store, const std::function<at::Tensor(const Param&)>& dense = nullptr);

}  // namespace tightfit
