// Writes a GGUF v3 file (ggml's docs/gguf.md): typed metadata, tensor infos,
// then each tensor's blocks at the file's alignment. Tensors arrive one at a
// time and are spooled to an unlinked file beside the output (the header
// needs every tensor's name, shape and offset before the first byte of
// data), so a model is never held whole in memory. The output appears
// whole or not at all (write_file_replacing).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf_file.hpp"

namespace tightfit::gguf {

class GgufWriter {
 public:
  explicit GgufWriter(std::string path);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Sets a metadata key (a later set of the same key replaces its value,
  // keeping its place).
  void set(const std::string& key, Value value);
  void set_string(const std::string& key, const std::string& s);
  void set_u32(const std::string& key, uint32_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);

  // A tensor of `type` in PyTorch's shape order, as `bytes` (its blocks,
  // already encoded). Throws GgufError for a duplicate name or a size that
  // does not match the shape and type.
  void add_tensor(const std::string& name, const std::vector<int64_t>& torch_shape,
                  const TensorType& type, const void* bytes, uint64_t n_bytes);
  size_t tensor_count() const { return infos_.size(); }

  // Writes the file. Throws std::runtime_error; the output is then as it was.
  void finish();

 private:
  std::string path_;
  int spool_ = -1;
  uint64_t spooled_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<TensorInfo> infos_;
};

// Value constructors for metadata.
Value string_value(const std::string& s);
Value u32_value(uint32_t v);
Value i32_value(int32_t v);
Value f32_value(float v);
Value bool_value(bool v);
Value array_value(ValueType item_type, std::vector<Value> items);

}  // namespace tightfit::gguf
