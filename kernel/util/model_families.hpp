// The model families tightfit reads and writes, one row each: what
// transformers calls a family (config.json's model_type), AutoTokenizer's
// class for it, what llama.cpp calls it (GGUF's general.architecture, as
// export writes it and as a file that reads as it carries it), and how it
// routes experts. GGUF read (formats/gguf_model.cpp), GGUF export
// (formats/gguf_export.cpp, gguf_experts.cpp) and the tokenizer's class
// (text/tokenizer_config.cpp) learn a family from this table alone; which
// model_types a model plugin loads it says itself (hf_model_types). What
// adding a family takes: docs/models.md, "Adding a family".
#pragma once

#include <string>
#include <vector>

namespace tightfit {

// How a family routes tokens to experts, as llama.cpp's graph of that
// layout computes it and convert_hf_to_gguf writes it.
enum class ExpertLayout {
  kNone,     // dense
  kMixtral,  // block_sparse_moe.experts.N.w1/w3/w2, num_local_experts; in
             // GGUF a llama with an expert_count; experts in every layer,
             // intermediate_size wide
  kOlmoe,    // mlp.experts.N.{gate,up,down}_proj, num_experts, every layer
  kQwenMoe,  // the same names, num_experts, moe_intermediate_size wide; a
             // shared expert where shared_expert says
};

struct ModelFamily {
  const char* model_type;       // config.json's
  const char* tokenizer_class;  // transformers' TOKENIZER_MAPPING_NAMES
  // GGUF: the architecture export writes (nullptr: none; export refuses
  // the family by name), and the one a file carries that reads as this
  // family (nullptr: no file does).
  const char* gguf_writes = nullptr;
  const char* gguf_reads = nullptr;
  // The GGUF architecture's head size is rope.dimension_count (written with
  // vocab_size), not attention.key_length: llama.cpp's llama and mistral.
  bool rope_dimension_count = false;
  // In a file of this family's gguf_reads architecture, q's and k's rows
  // are permuted per head (convert_hf_to_gguf's LlamaModel.permute).
  bool permuted_qk = false;
  ExpertLayout experts = ExpertLayout::kNone;
  const char* expert_count_key = nullptr;  // config.json's number of routed experts
  bool shared_expert = false;              // Qwen2-MoE's, in every block
  bool normalized_topk = false;            // llama.cpp normalizes the chosen experts' weights
};

const std::vector<ModelFamily>& model_families();

// The row of a config.json model_type; nullptr when none.
const ModelFamily* family_of_model_type(const std::string& model_type);

// The family a GGUF file of `arch` reads as: of the rows that read `arch`,
// the one with experts when the file gives `<arch>.expert_count` (a llama
// with experts is Mixtral) or when there is no other; nullptr when none.
const ModelFamily* family_of_gguf(const std::string& arch, bool expert_count);

// For messages: the GGUF architectures read ("llama, mistral, ... and
// qwen3moe") and the model_types written as GGUF.
std::string gguf_read_architectures();
// The architectures read with experts, each with its family: "llama
// (mixtral), olmoe (olmoe), ...".
std::string gguf_expert_architectures();
std::string gguf_written_model_types();

}  // namespace tightfit
