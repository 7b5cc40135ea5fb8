#include "gguf_file.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

#include "file_util.hpp"
#include "gguf_quants.hpp"
#include "gguf_types.hpp"

namespace tightfit::gguf {
namespace {

// A buffered, bounds-checked cursor over the file's front matter.
class Cursor {
 public:
  Cursor(int fd, uint64_t file_size, const std::string& path)
      : fd_(fd), size_(file_size), path_(path) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& why) const {
    throw GgufError(path_ + ": " + why + " (at byte " + std::to_string(pos_) + ")");
  }

  void read(void* dst, uint64_t n, const char* what) {
    if (n > left()) fail(std::string("the file ends inside ") + what);
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      if (buf_pos_ == buf_.size()) refill();
      const uint64_t take = std::min<uint64_t>(n, buf_.size() - buf_pos_);
      std::memcpy(out, buf_.data() + buf_pos_, take);
      out += take, n -= take, buf_pos_ += take, pos_ += take;
    }
  }
  template <typename T>
  T scalar(const char* what) {
    T v;
    read(&v, sizeof v, what);  // GGUF is little-endian, as every host tightfit builds for
    return v;
  }
  std::string string(uint64_t max_len, const char* what) {
    const auto n = scalar<uint64_t>(what);
    if (n > max_len)
      fail(std::string(what) + " is " + std::to_string(n) + " bytes, past the " +
           std::to_string(max_len) + "-byte limit");
    if (n > left())
      fail(std::string("the file ends inside ") + what + " (" + std::to_string(n) +
           " bytes announced)");
    std::string s(n, '\0');
    read(s.data(), n, what);
    return s;
  }

 private:
  void refill() {
    const uint64_t n = std::min<uint64_t>(uint64_t{1} << 20, size_ - pos_);
    buf_.resize(static_cast<size_t>(n));
    if (!read_at(fd_, buf_.data(), n, pos_)) fail("cannot read (the file changed?)");
    buf_pos_ = 0;
  }
  int fd_;
  uint64_t size_;
  const std::string& path_;
  uint64_t pos_ = 0;
  std::vector<char> buf_;
  size_t buf_pos_ = 0;
};

// The fewest bytes one value of `t` takes in the file (a string: its length).
uint64_t min_encoded_bytes(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::ARRAY:
      return 12;  // item type and count
    default:
      return 8;  // STRING (its length), UINT64, INT64, FLOAT64
  }
}

bool valid_value_type(uint32_t t) {
  return t <= 12;
}

struct ValueReader {
  Cursor& in;
  const Limits& limits;
  uint64_t budget;  // bytes of memory the values may still take

  void charge(uint64_t bytes, const std::string& key) {
    if (bytes > budget)
      in.fail("the metadata (at " + key + ") takes more than " +
              std::to_string(limits.max_metadata_bytes) + " bytes in memory");
    budget -= bytes;
  }

  Value read(ValueType type, const std::string& key, int depth) {
    Value v;
    v.type = type;
    charge(sizeof(Value), key);
    switch (type) {
      case ValueType::UINT8:
        v.i = in.scalar<uint8_t>("a value");
        break;
      case ValueType::INT8:
        v.i = in.scalar<int8_t>("a value");
        break;
      case ValueType::UINT16:
        v.i = in.scalar<uint16_t>("a value");
        break;
      case ValueType::INT16:
        v.i = in.scalar<int16_t>("a value");
        break;
      case ValueType::UINT32:
        v.i = in.scalar<uint32_t>("a value");
        break;
      case ValueType::INT32:
        v.i = in.scalar<int32_t>("a value");
        break;
      case ValueType::INT64:
        v.i = in.scalar<int64_t>("a value");
        break;
      case ValueType::UINT64:
        v.u = in.scalar<uint64_t>("a value");
        v.i = v.u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                  ? static_cast<int64_t>(v.u)
                  : -1;
        break;
      case ValueType::FLOAT32:
        v.f = in.scalar<float>("a value");
        break;
      case ValueType::FLOAT64:
        v.f = in.scalar<double>("a value");
        break;
      case ValueType::BOOL: {
        const auto b = in.scalar<uint8_t>("a value");
        if (b > 1) in.fail(key + ": a bool is " + std::to_string(b) + ", not 0 or 1");
        v.b = b == 1;
        break;
      }
      case ValueType::STRING:
        v.s = in.string(limits.max_string, "a string");
        charge(v.s.size(), key);
        break;
      case ValueType::ARRAY: {
        if (depth >= limits.max_nesting)
          in.fail(key + ": arrays nest deeper than " + std::to_string(limits.max_nesting));
        const auto item = in.scalar<uint32_t>("an array's item type");
        if (!valid_value_type(item))
          in.fail(key + ": unknown array item type " + std::to_string(item));
        v.item_type = static_cast<ValueType>(item);
        const auto n = in.scalar<uint64_t>("an array's length");
        if (n > limits.max_array)
          in.fail(key + ": an array of " + std::to_string(n) + " items, past the limit of " +
                  std::to_string(limits.max_array));
        // Each item takes at least this many bytes of what is left.
        if (n > in.left() / min_encoded_bytes(v.item_type))
          in.fail(key + ": an array of " + std::to_string(n) + " items cannot fit in the " +
                  std::to_string(in.left()) + " bytes left");
        charge(n * sizeof(Value), key);
        v.items.reserve(static_cast<size_t>(n));
        for (uint64_t k = 0; k < n; ++k) v.items.push_back(read(v.item_type, key, depth + 1));
        break;
      }
    }
    return v;
  }
};

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                "int32",  "float32", "bool",   "string", "array",
                                "uint64", "int64",   "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "unknown";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
    case ValueType::BOOL:
    case ValueType::STRING:
    case ValueType::ARRAY:
      return false;
    default:
      return true;
  }
}

int64_t Value::as_int(const std::string& key) const {
  if (!is_integer()) throw GgufError(key + " is " + value_type_name(type) + ", not an integer");
  if (type == ValueType::UINT64 && i < 0)
    throw GgufError(key + " = " + std::to_string(u) + " is past int64");
  return i;
}
double Value::as_number(const std::string& key) const {
  if (type == ValueType::FLOAT32 || type == ValueType::FLOAT64) return f;
  return static_cast<double>(as_int(key));
}
bool Value::as_bool(const std::string& key) const {
  if (type != ValueType::BOOL)
    throw GgufError(key + " is " + value_type_name(type) + ", not a bool");
  return b;
}
const std::string& Value::as_string(const std::string& key) const {
  if (type != ValueType::STRING)
    throw GgufError(key + " is " + value_type_name(type) + ", not a string");
  return s;
}
const std::vector<Value>& Value::as_array(const std::string& key) const {
  if (type != ValueType::ARRAY)
    throw GgufError(key + " is " + value_type_name(type) + ", not an array");
  return items;
}

std::vector<int64_t> TensorInfo::torch_shape() const {
  return {dims.rbegin(), dims.rend()};
}

GgufReader::GgufReader(const std::string& path, const Limits& limits) : path_(path) {
  auto fail = [&](const std::string& why) { return GgufError(path + ": " + why); };
  try {
    fd_ = open_regular_for_reading(path, &file_size_);
  } catch (const std::runtime_error& e) {
    throw fail(e.what());
  }
  const int fd = *fd_;

  Cursor in(fd, file_size_, path_);
  char magic[4];
  if (file_size_ < 24)
    throw fail("too short to be a GGUF file (" + std::to_string(file_size_) + " bytes)");
  in.read(magic, 4, "the magic");
  if (std::memcmp(magic, "GGUF", 4) != 0)
    throw fail("not a GGUF file (it does not start with \"GGUF\")");
  version_ = in.scalar<uint32_t>("the version");
  if (version_ != 2 && version_ != 3)
    throw fail("GGUF version " + std::to_string(version_) + " (tightfit reads versions 2 and 3)");
  const auto n_tensors = in.scalar<uint64_t>("the tensor count");
  const auto n_keys = in.scalar<uint64_t>("the metadata count");
  if (n_keys > limits.max_keys)
    throw fail(std::to_string(n_keys) + " metadata entries, past the limit of " +
               std::to_string(limits.max_keys));
  if (n_tensors > limits.max_tensors)
    throw fail(std::to_string(n_tensors) + " tensors, past the limit of " +
               std::to_string(limits.max_tensors));
  // A key takes at least 12 bytes (length, type), a tensor info at least 28.
  if (n_keys > in.left() / 12 || n_tensors > in.left() / 28)
    throw fail(std::to_string(n_keys) + " metadata entries and " + std::to_string(n_tensors) +
               " tensors cannot fit in the file's " + std::to_string(file_size_) + " bytes");

  ValueReader values{in, limits, limits.max_metadata_bytes};
  for (uint64_t k = 0; k < n_keys; ++k) {
    std::string key = in.string(1 << 16, "a metadata key");
    const auto type = in.scalar<uint32_t>("a metadata type");
    if (!valid_value_type(type)) in.fail(key + ": unknown value type " + std::to_string(type));
    Value v = values.read(static_cast<ValueType>(type), key, 0);
    if (metadata_.count(key)) in.fail("the metadata key " + key + " appears twice");
    key_order_.push_back(key);
    metadata_.emplace(std::move(key), std::move(v));
  }
  if (const Value* a = find("general.alignment")) {
    if (a->type != ValueType::UINT32)
      throw fail(std::string("general.alignment is ") + value_type_name(a->type) + ", not uint32");
    alignment_ = static_cast<uint64_t>(a->i);
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ > (1u << 20))
      throw fail("general.alignment = " + std::to_string(alignment_) +
                 " is not a power of two up to 1 MiB");
  }

  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo t;
    t.name = in.string(1 << 16, "a tensor name");
    const auto n_dims = in.scalar<uint32_t>("a tensor's dimension count");
    if (n_dims == 0 || n_dims > 4)
      in.fail("tensor " + t.name + " has " + std::to_string(n_dims) +
              " dimensions (GGUF allows 1 to 4)");
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto ne = in.scalar<uint64_t>("a tensor's dimension");
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel, static_cast<int64_t>(ne), &numel))
        in.fail("tensor " + t.name + " has an absurd shape (its element count passes int64)");
      t.dims.push_back(static_cast<int64_t>(ne));
    }
    const auto type_id = in.scalar<uint32_t>("a tensor's type");
    t.type = tensor_type(type_id);
    if (!t.type)
      in.fail("tensor " + t.name + " has type " + std::to_string(type_id) +
              ", which tightfit does not know");
    t.offset = in.scalar<uint64_t>("a tensor's offset");
    t.numel = numel;
    if (t.dims[0] % t.type->block != 0)
      in.fail("tensor " + t.name + ": its first dimension " + std::to_string(t.dims[0]) +
              " is not a multiple of " + t.type->name + "'s block of " +
              std::to_string(t.type->block));
    // Checked: a shape near 2^62 elements would wrap the byte count to a small
    // number that passes the bounds check below, and so would its float size.
    int64_t float_bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(numel / t.type->block),
                               static_cast<uint64_t>(t.type->bytes), &t.bytes) ||
        __builtin_mul_overflow(numel, static_cast<int64_t>(sizeof(float)), &float_bytes))
      in.fail("tensor " + t.name + " has an absurd shape (its size in bytes passes 64 bits)");
    if (t.offset % alignment_ != 0)
      in.fail("tensor " + t.name + "'s offset " + std::to_string(t.offset) + " is not aligned to " +
              std::to_string(alignment_));
    if (tensor_index_.count(t.name)) in.fail("the tensor name " + t.name + " appears twice");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  data_offset_ = (in.pos() + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t data_size = file_size_ >= data_offset_ ? file_size_ - data_offset_ : 0;
  // Every tensor inside the data section, and no two overlapping.
  std::vector<std::pair<uint64_t, const TensorInfo*>> spans;
  for (const TensorInfo& t : tensors_) {
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      throw fail("tensor " + t.name + " (" + std::to_string(t.bytes) + " bytes at data offset " +
                 std::to_string(t.offset) +
                 ") runs past the end of the file (the data section has " +
                 std::to_string(data_size) + " bytes): the file is cut short or corrupt");
    spans.emplace_back(t.offset, &t);
  }
  std::sort(spans.begin(), spans.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t k = 1; k < spans.size(); ++k)
    if (spans[k - 1].first + spans[k - 1].second->bytes > spans[k].first)
      throw fail("tensors " + spans[k - 1].second->name + " and " + spans[k].second->name +
                 " overlap");
}

const Value* GgufReader::find(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const Value& GgufReader::get(const std::string& key) const {
  if (const Value* v = find(key)) return *v;
  throw GgufError(path_ + ": no metadata key " + key);
}

const TensorInfo* GgufReader::find_tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

at::Tensor GgufReader::read_raw(const TensorInfo& t) const {
  at::Tensor out = at::empty({static_cast<int64_t>(t.bytes)}, at::kByte);
  if (!read_at(*fd_, out.data_ptr(), t.bytes, data_offset_ + t.offset))
    throw GgufError(path_ + ": cannot read tensor " + t.name + " (the file changed?)");
  return out;
}

at::Tensor GgufReader::read_float(const TensorInfo& t) const {
  if (!can_dequantize(*t.type))
    throw GgufError(path_ + ": tensor " + t.name + " is " + t.type->name +
                    ", which tightfit does not decode (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                    "Q5_1, Q8_0, Q4_K, Q5_K and Q6_K): requantize the file with llama.cpp's "
                    "llama-quantize");
  const at::Tensor raw = read_raw(t);
  at::Tensor out = at::empty({t.numel}, at::kFloat);
  dequantize(*t.type, raw.data_ptr<uint8_t>(), t.numel, out.data_ptr<float>());
  return out.view(t.torch_shape());
}

}  // namespace tightfit::gguf
