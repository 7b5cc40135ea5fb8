// The safetensors format (8-byte little-endian header length, JSON header,
// raw little-endian data), read with validation before any allocation.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

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

// A file opened for reading tensors one at a time (a model larger than
// memory loads stage by stage). The constructor opens it once (a regular
// file only: a FIFO or device is refused, never waited on), reads and
// validates the header (header size, JSON nested at most 8 levels, dtypes,
// shapes vs byte sizes with overflow checks, offsets inside the file, no
// overlaps) before any tensor is allocated; tensors are read from that same
// descriptor, never by reopening the path. Throws SafetensorsError naming
// the file and the defect.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Reads one tensor (CPU, its stored dtype).
  at::Tensor read(const std::string& name) const;

 private:
  struct Entry {
    std::string name;
    at::ScalarType type;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::string path_;
  std::shared_ptr<const int> fd_;  // the descriptor the header was read from; closed last
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Reads and validates a whole file (SafetensorsReader, then every tensor).
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace tightfit
