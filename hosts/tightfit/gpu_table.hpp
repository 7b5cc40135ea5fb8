// The consumer and datacenter GPUs the field notes size recipes for, with
// their memory, for `tightfit plan --gpus`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tightfit::host {

struct GpuModel {
  const char* name;  // as `--gpus` takes it, e.g. "4090"
  const char* label;
  double gib;  // memory on the card
};

inline const std::vector<GpuModel>& gpu_models() {
  static const std::vector<GpuModel> models = {
      {"3060", "RTX 3060 12GB", 12}, {"3070", "RTX 3070 8GB", 8},   {"3080", "RTX 3080 10GB", 10},
      {"4070", "RTX 4070 12GB", 12}, {"4080", "RTX 4080 16GB", 16}, {"4090", "RTX 4090 24GB", 24},
      {"5080", "RTX 5080 16GB", 16}, {"a100-40", "A100 40GB", 40},  {"a100-80", "A100 80GB", 80},
      {"h100", "H100 80GB", 80},
  };
  return models;
}

// What a training process can use of a card: the CUDA context and the
// caching allocator's fragmentation take some (here 5% and 0.5 GiB).
inline int64_t usable_bytes(const GpuModel& g) {
  const double gib = g.gib * 0.95 - 0.5;
  return static_cast<int64_t>(gib * 1024.0 * 1024.0 * 1024.0);
}

}  // namespace tightfit::host
