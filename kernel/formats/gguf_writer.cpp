#include "gguf_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "file_util.hpp"
#include "input_files.hpp"

namespace tightfit::gguf {
namespace {

constexpr uint64_t kAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT

uint64_t padded(uint64_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

// The header, metadata and tensor infos, appended to a byte string.
class Encoder {
 public:
  std::string bytes;

  template <typename T>
  void scalar(T v) {
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);  // little-endian hosts only
  }
  void string(const std::string& s) {
    scalar<uint64_t>(s.size());
    bytes += s;
  }
  void value(const Value& v) {
    switch (v.type) {
      case ValueType::UINT8:
        return scalar(static_cast<uint8_t>(v.i));
      case ValueType::INT8:
        return scalar(static_cast<int8_t>(v.i));
      case ValueType::UINT16:
        return scalar(static_cast<uint16_t>(v.i));
      case ValueType::INT16:
        return scalar(static_cast<int16_t>(v.i));
      case ValueType::UINT32:
        return scalar(static_cast<uint32_t>(v.i));
      case ValueType::INT32:
        return scalar(static_cast<int32_t>(v.i));
      case ValueType::INT64:
        return scalar(static_cast<int64_t>(v.i));
      case ValueType::UINT64:
        return scalar(v.u ? v.u : static_cast<uint64_t>(v.i));
      case ValueType::FLOAT32:
        return scalar(static_cast<float>(v.f));
      case ValueType::FLOAT64:
        return scalar(v.f);
      case ValueType::BOOL:
        return scalar(static_cast<uint8_t>(v.b ? 1 : 0));
      case ValueType::STRING:
        return string(v.s);
      case ValueType::ARRAY:
        scalar(static_cast<uint32_t>(v.item_type));
        scalar<uint64_t>(v.items.size());
        for (const Value& item : v.items) value(item);
        return;
    }
  }
};

template <typename Set>
Value value_of(ValueType type, Set&& set) {
  Value v;
  v.type = type;
  set(v);
  return v;
}
}  // namespace

Value string_value(const std::string& s) {
  return value_of(ValueType::STRING, [&](Value& v) { v.s = s; });
}
Value u32_value(uint32_t x) {
  return value_of(ValueType::UINT32, [&](Value& v) { v.i = x; });
}
Value i32_value(int32_t x) {
  return value_of(ValueType::INT32, [&](Value& v) { v.i = x; });
}
Value f32_value(float x) {
  return value_of(ValueType::FLOAT32, [&](Value& v) { v.f = x; });
}
Value bool_value(bool x) {
  return value_of(ValueType::BOOL, [&](Value& v) { v.b = x; });
}
Value array_value(ValueType item_type, std::vector<Value> items) {
  return value_of(ValueType::ARRAY, [&](Value& v) {
    v.item_type = item_type;
    v.items = std::move(items);
  });
}

GgufWriter::GgufWriter(std::string path) : path_(std::move(path)) {
  refuse_output_over_inputs(path_, /*folder=*/false, "a GGUF file");
  // Unlinked as soon as it exists: nothing is left behind on any exit.
  static std::atomic<uint64_t> counter{0};
  const std::string spool =
      path_ + ".spool-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  spool_ = ::open(spool.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (spool_ < 0)
    throw std::runtime_error("cannot create " + spool + ": " + std::strerror(errno) +
                             (errno == EEXIST ? " (something is in the way: remove it)" : ""));
  ::unlink(spool.c_str());
}

GgufWriter::~GgufWriter() {
  if (spool_ >= 0) ::close(spool_);
}

void GgufWriter::set(const std::string& key, Value value) {
  for (auto& [k, v] : metadata_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  metadata_.emplace_back(key, std::move(value));
}
void GgufWriter::set_string(const std::string& key, const std::string& s) {
  set(key, string_value(s));
}
void GgufWriter::set_u32(const std::string& key, uint32_t v) {
  set(key, u32_value(v));
}
void GgufWriter::set_f32(const std::string& key, float v) {
  set(key, f32_value(v));
}
void GgufWriter::set_bool(const std::string& key, bool v) {
  set(key, bool_value(v));
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<int64_t>& torch_shape,
                            const TensorType& type, const void* bytes, uint64_t n_bytes) {
  for (const TensorInfo& t : infos_)
    if (t.name == name) throw GgufError(path_ + ": tensor " + name + " is written twice");
  TensorInfo info;
  info.name = name;
  info.dims.assign(torch_shape.rbegin(), torch_shape.rend());
  info.type = &type;
  info.numel = 1;
  for (int64_t d : torch_shape) info.numel *= d;
  if (info.dims.empty() || info.numel % type.block != 0 || info.dims[0] % type.block != 0 ||
      static_cast<uint64_t>(info.numel / type.block * type.bytes) != n_bytes)
    throw GgufError(path_ + ": tensor " + name + " has " + std::to_string(n_bytes) +
                    " bytes, not what its shape takes as " + type.name);
  info.offset = spooled_;
  info.bytes = n_bytes;
  write_all(spool_, bytes, n_bytes, path_);
  const std::string zeros(padded(n_bytes) - n_bytes, '\0');
  write_all(spool_, zeros.data(), zeros.size(), path_);
  spooled_ += padded(n_bytes);
  infos_.push_back(std::move(info));
}

void GgufWriter::finish() {
  Encoder e;
  e.bytes = "GGUF";
  e.scalar<uint32_t>(3);
  e.scalar<uint64_t>(infos_.size());
  e.scalar<uint64_t>(metadata_.size());
  for (const auto& [key, v] : metadata_) {
    e.string(key);
    e.scalar(static_cast<uint32_t>(v.type));
    e.value(v);
  }
  for (const TensorInfo& t : infos_) {
    e.string(t.name);
    e.scalar<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) e.scalar<uint64_t>(static_cast<uint64_t>(d));
    e.scalar<uint32_t>(t.type->id);
    e.scalar<uint64_t>(t.offset);
  }
  e.bytes.resize(padded(e.bytes.size()), '\0');
  write_file_replacing(path_, [&](int fd) {
    write_all(fd, e.bytes.data(), e.bytes.size(), path_);
    std::vector<char> chunk(size_t{8} << 20);
    for (uint64_t at = 0; at < spooled_;) {
      const uint64_t n = std::min<uint64_t>(chunk.size(), spooled_ - at);
      if (!read_at(spool_, chunk.data(), n, at))
        throw std::runtime_error("cannot read back the tensors spooled for " + path_);
      write_all(fd, chunk.data(), n, path_);
      at += n;
    }
  });
}

}  // namespace tightfit::gguf
