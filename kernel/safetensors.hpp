// The safetensors format (8-byte little-endian header length, JSON header,
// raw little-endian data), read with validation before any allocation.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <stdexcept>
#include <string>

namespace tightfit {

struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Writes and fsyncs `path`. Tensors are written contiguous, on CPU.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads and validates (header size, JSON, dtypes, shapes vs byte sizes with
// overflow checks, offsets inside the file, no overlaps). Throws
// SafetensorsError naming the file and the defect.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace tightfit
