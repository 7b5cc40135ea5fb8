// GGUF, the file format of llama.cpp, ollama and LM Studio (ggml's
// docs/gguf.md): a header, typed key/value metadata, tensor infos, then the
// tensors' blocks at an alignment. Read as untrusted input: every count,
// length, nesting, type, shape, offset and size is checked against the
// file and against fixed bounds before anything is allocated for it.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf_types.hpp"

namespace tightfit::gguf {

// gguf_type: the metadata value types.
enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Integers keep their sign in `i` (all signed types
// and unsigned ones up to 2^63) or `u` (UINT64); an array holds its items.
struct Value {
  ValueType type = ValueType::UINT8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string s;
  ValueType item_type = ValueType::UINT8;  // ARRAY only
  std::vector<Value> items;                // ARRAY only

  bool is_integer() const;
  // The value as an integer (any integer type in range) or throws naming `key`.
  int64_t as_int(const std::string& key) const;
  double as_number(const std::string& key) const;  // integer or float
  bool as_bool(const std::string& key) const;
  const std::string& as_string(const std::string& key) const;
  const std::vector<Value>& as_array(const std::string& key) const;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF's order: dims[0] is the contiguous (fastest) one
  const TensorType* type = nullptr;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t bytes = 0;
  int64_t numel = 0;
  // The shape in PyTorch's order (dims reversed): a matrix of ne0 columns
  // and ne1 rows is [ne1, ne0].
  std::vector<int64_t> torch_shape() const;
};

// Bounds a file must stay inside (far past any real model's).
struct Limits {
  uint64_t max_keys = 1 << 16;
  uint64_t max_tensors = 1 << 20;
  uint64_t max_string = uint64_t{1} << 24;          // 16 MiB (a chat template is a few KiB)
  uint64_t max_array = uint64_t{1} << 24;           // 16M items (vocabularies are ~256K)
  uint64_t max_metadata_bytes = uint64_t{1} << 30;  // what the values take in memory, all told
  int max_nesting = 4;                              // arrays of arrays
};

// A GGUF file opened for reading tensors one at a time. The constructor
// opens it once (a regular file only: a FIFO or device is refused, never
// waited on), reads and checks the header, the metadata and the tensor
// infos; tensors are then read from that same descriptor. Throws
// GgufError naming the file and the defect.
class GgufReader {
 public:
  explicit GgufReader(const std::string& path, const Limits& limits = {});
  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::vector<std::string>& keys() const { return key_order_; }
  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  // The value or a GgufError naming the file and the key.
  const Value& get(const std::string& key) const;
  const Value* find(const std::string& key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;
  // A tensor's stored bytes (uint8, CPU), as they are in the file.
  at::Tensor read_raw(const TensorInfo& t) const;
  // A tensor's values as float32, in PyTorch's shape order (gguf_quants).
  at::Tensor read_float(const TensorInfo& t) const;

 private:
  std::string path_;
  std::shared_ptr<const int> fd_;
  uint64_t file_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, Value> metadata_;
  std::vector<std::string> key_order_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace tightfit::gguf
