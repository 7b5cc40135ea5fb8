// LoRA's state, shared by its hooks (lora.cpp) and its PEFT adapter files
// (peft_adapter.cpp).
#pragma once

#include <map>
#include <string>

#include "tightfit/plugin_sdk.hpp"

namespace lora {

struct Adapter {
  std::string a, b;  // parameter names of A [r, in] and B [out, r]
};

struct Lora {
  tf_sdk::Host host;
  int64_t rank = 8;
  double alpha = 16.0;
  double scale = 2.0;  // alpha / rank
  double dropout = 0.0;
  std::string adapter_dir;                  // a PEFT adapter folder to start from
  std::map<std::string, Adapter> adapters;  // by base weight name
  bool enabled = true;  // off: the base model alone (a preference reference pass)
};

// Writes adapter_model.safetensors and adapter_config.json (PEFT's names:
// "base_model.model.<module>.lora_A.weight") into `dir`.
void write_peft_adapter(const Lora& s, const std::string& dir);

// Loads a PEFT adapter folder into the adapter parameters; throws
// std::invalid_argument naming the file and what does not match the recipe.
void read_peft_adapter(const Lora& s, const std::string& dir);

}  // namespace lora
