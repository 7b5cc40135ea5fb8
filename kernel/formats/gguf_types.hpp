// What GGUF's readers, writers and block codecs share: its error, and
// ggml's tensor types with the layout of their blocks.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace tightfit::gguf {

struct GgufError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ggml_type: how a tensor's elements are stored. `block` elements take
// `bytes` bytes.
struct TensorType {
  uint32_t id;
  const char* name;
  int64_t block;
  int64_t bytes;
};
// The types this reader knows the layout of (it can check their sizes);
// nullptr for another id.
const TensorType* tensor_type(uint32_t id);
// The type named `name` ("Q4_1", "F16"), nullptr for none.
const TensorType* tensor_type_named(const std::string& name);

}  // namespace tightfit::gguf
