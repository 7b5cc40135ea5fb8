// Weights with Hugging Face names: import into the parameter store (and the
// inverse for export), transposing the weights a model flags as stored
// [in, out] by Hugging Face (TF_PARAM_HF_TRANSPOSED).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>

#include "param_store.hpp"

namespace tightfit {

// Copies every parameter of `store` from `tensors`. A name may also be found
// without a leading "<prefix>." (original GPT-2 files omit "transformer.").
// Throws std::runtime_error naming a missing or mis-shaped tensor.
void import_hf_weights(ParamStore& store, const std::map<std::string, at::Tensor>& tensors,
                       const std::string& source);

// Reads a .safetensors file, or a folder holding model.safetensors or
// sharded model-0000x-of-0000y.safetensors with model.safetensors.index.json.
void load_hf_weights(ParamStore& store, const std::string& path);

// Writes a folder transformers' from_pretrained loads: model.safetensors
// (Hugging Face names and layouts), config.json, and tokenizer.json when given.
void save_hf_model(const ParamStore& store, const std::string& dir, const std::string& config_json,
                   const std::string& tokenizer_json_path,
                   const std::function<at::Tensor(const Param&)>& dense = nullptr);

// The store's parameters under Hugging Face names and layouts; `dense` gives
// the dense value of a parameter stored in a compact format.
std::map<std::string, at::Tensor> export_hf_weights(
    const ParamStore& store, const std::function<at::Tensor(const Param&)>& dense = nullptr);

}  // namespace tightfit
