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

// A safetensors file written tensor by tensor as each one comes, so a file
// larger than memory (a checkpoint of disk-tier optimizer state) never has
// to be gathered first. Each tensor's bytes go to the file at once, after a
// space kept for the header; finish() writes the header there (padded with
// spaces, as the format allows), moving the data when the header outgrew the
// space or when a small file would carry mostly padding, so the data section
// stays contiguous as Python's safetensors requires. The file is built
// beside `path` (O_EXCL, never through a symlink) and renamed over it only by
// finish(); one never finished is removed. Throws SafetensorsError naming
// the file.
class SafetensorsWriter {
 public:
  static constexpr uint64_t kDefaultHeaderSpace = 1ull << 20;
  SafetensorsWriter(std::string path, std::map<std::string, std::string> metadata = {},
                    uint64_t header_space = kDefaultHeaderSpace);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes `t` (any device; copied to the CPU contiguous) now. A name given
  // twice is refused.
  void put(const std::string& name, const at::Tensor& t);
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // The header, an fsync and the rename: `path` is complete or untouched.
  void finish();
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    at::ScalarType type;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::string header_text() const;
  void move_data(uint64_t to);

  std::string path_, tmp_;
  int fd_ = -1;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, Entry> entries_;
  uint64_t data_start_ = 0, data_bytes_ = 0;
};

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
  // A tensor's shape from the header (nothing read); throws for a name it lacks.
  const std::vector<int64_t>& shape(const std::string& name) const;
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

// Several files read as one set of names, a tensor at a time: a checkpoint's
// state (rank 0's file, then every other rank's). The first file added that
// holds a name gives it.
class SafetensorsSet {
 public:
  void add(const std::string& path) { files_.emplace_back(path); }
  bool contains(const std::string& name) const;
  // Throws std::out_of_range when no file holds `name`.
  at::Tensor read(const std::string& name) const;

 private:
  std::vector<SafetensorsReader> files_;
};

// Reads and validates a whole file (SafetensorsReader, then every tensor).
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace tightfit
