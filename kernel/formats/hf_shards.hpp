// Writes a model as Hugging Face safetensors shards, a tensor at a time: a
// shard is written (and its tensors freed) once the next tensor would take it
// past max_shard_bytes, so the peak is about one shard, never the model.
// finish() names the shards model-0000i-of-0000n.safetensors and writes
// model.safetensors.index.json as save_pretrained does (one shard:
// model.safetensors, no index).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tightfit {

class HfShardWriter {
 public:
  HfShardWriter(std::string dir, int64_t max_shard_bytes);
  // An export that failed before finish() (a full disk) leaves none of its
  // shards behind: the ones already written are removed.
  ~HfShardWriter();
  HfShardWriter(const HfShardWriter&) = delete;
  HfShardWriter& operator=(const HfShardWriter&) = delete;
  // `t` in Hugging Face's name and layout.
  void add(const std::string& name, const at::Tensor& t);
  // Returns the files written.
  std::vector<std::string> finish();
  int64_t total_bytes() const { return total_bytes_; }

 private:
  void flush();
  std::string dir_;
  int64_t max_shard_bytes_, current_bytes_ = 0, total_bytes_ = 0;
  std::map<std::string, at::Tensor> current_;
  std::vector<std::vector<std::string>> shards_;  // tensor names per written shard
  size_t renamed_ = 0;                            // shards moved to their final names
};

}  // namespace tightfit
