// The mixture-of-experts part of a GGUF model, as llama.cpp's
// convert_hf_to_gguf.py writes Mixtral (architecture llama), OLMoE,
// Qwen2-MoE and Qwen3-MoE: the expert keys of the architecture's metadata,
// and each layer's experts stacked into one tensor per projection (Hugging
// Face's mlp.experts.E.gate_proj.weight, or Mixtral's
// block_sparse_moe.experts.E.w1.weight, E = 0..n-1, become
// blk.L.ffn_gate_exps.weight [n, out, in]).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gguf_writer.hpp"

namespace tightfit::gguf {

// Whether config.json's model routes experts (its model_type's row in
// util/model_families.hpp has an expert layout), and how many each layer
// has (the row's expert_count_key; 0 for a dense model).
bool routes_experts(const nlohmann::json& config);
int64_t routed_expert_count(const nlohmann::json& config);

// A routed expert's weight (model.layers.L.mlp.experts.E.up_proj.weight,
// or Mixtral's ...block_sparse_moe.experts.E.w3.weight): its index and the
// GGUF name of its layer's stack (blk.L.ffn_up_exps.weight), and the name
// of its own tensor in the files llama.cpp wrote before it stacked experts
// (early 2024 Mixtral files: blk.L.ffn_up.E.weight).
struct ExpertName {
  int64_t index = 0;
  std::string stack;
  std::string single;
};
std::optional<ExpertName> expert_name(const std::string& hf_name);

// The keys convert_hf_to_gguf adds for the experts (expert_count,
// expert_used_count and, for Qwen-MoE, expert_feed_forward_length and
// Qwen2-MoE's expert_shared_feed_forward_length). Throws GgufError, naming
// the key, for a config llama.cpp's graph would compute differently: a
// dense layer among the expert ones (mlp_only_layers, decoder_sparse_step),
// top-k weights normalized where llama.cpp does not (or not where it does),
// Mixtral's sliding window (llama.cpp's llama graph attends to every
// position), OLMoE's clip_qkv or grouped keys (its olmoe graph neither
// clips nor groups).
void write_expert_keys(const nlohmann::json& config, const std::string& arch, GgufWriter& out);

// Collects the experts of each layer and projection until all n are in.
class ExpertStacks {
 public:
  explicit ExpertStacks(int64_t n_experts) : n_(n_experts) {}
  // Whether `hf_name` is one expert's weight. When it is the last of its
  // stack, `*stacked` gets the GGUF name and the [n, out, in] tensor.
  bool add(const std::string& hf_name, const at::Tensor& t,
           std::optional<std::pair<std::string, at::Tensor>>* stacked);
  // Throws GgufError naming a stack some experts never reached.
  void check_complete() const;

 private:
  int64_t n_;
  std::map<std::string, std::vector<at::Tensor>> partial_;  // GGUF name -> experts by index
};

}  // namespace tightfit::gguf
