#include "safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "file_util.hpp"
#include "input_files.hpp"
#include "json_input.hpp"

namespace tightfit {
namespace {

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {{"F32", at::kFloat},  {"F16", at::kHalf}, {"BF16", at::kBFloat16},
                                 {"F64", at::kDouble}, {"I64", at::kLong}, {"I32", at::kInt},
                                 {"I16", at::kShort},  {"I8", at::kChar},  {"U8", at::kByte},
                                 {"BOOL", at::kBool}};

const char* dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw SafetensorsError(std::string("safetensors cannot store dtype ") + c10::toString(t));
}

constexpr uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's limit

}  // namespace

namespace {
// Data moves in pieces of this size; and a file whose data is at most
// kCompactBytes keeps no more header padding than kSlackBytes.
constexpr uint64_t kMoveChunk = 8ull << 20;
constexpr uint64_t kCompactBytes = 64ull << 20;
constexpr uint64_t kSlackBytes = 4096;
uint64_t round8(uint64_t n) {
  return (n + 7) / 8 * 8;
}
}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, std::map<std::string, std::string> metadata,
                                     uint64_t header_space)
    : path_(std::move(path)), metadata_(std::move(metadata)) {
  refuse_output_over_inputs(path_, /*folder=*/false, "a safetensors file");
  static std::atomic<uint64_t> counter{0};
  tmp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw SafetensorsError("cannot create " + tmp_ + ": " + std::strerror(errno) +
                           (errno == EEXIST ? " (something is in the way: remove it)" : ""));
  data_start_ = round8(std::max<uint64_t>(header_space, 16));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void SafetensorsWriter::put(const std::string& name, const at::Tensor& t0) {
  if (fd_ < 0) throw SafetensorsError(path_ + ": written after it was finished");
  if (name == "__metadata__" || entries_.count(name))
    throw SafetensorsError(path_ + ": tensor \"" + name + "\" given twice");
  const at::Tensor t = t0.detach().to(at::kCPU).contiguous();
  const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
  dtype_name(t.scalar_type());  // refuses a dtype the format lacks before writing
  try {
    write_at(fd_, t.data_ptr(), bytes, data_start_ + data_bytes_, path_);
  } catch (const std::runtime_error& e) {
    throw SafetensorsError(e.what());
  }
  entries_.emplace(name, Entry{t.scalar_type(), t.sizes().vec(), data_bytes_, data_bytes_ + bytes});
  data_bytes_ += bytes;
}

std::string SafetensorsWriter::header_text() const {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  for (const auto& [name, e] : entries_)
    header[name] = {
        {"dtype", dtype_name(e.type)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  return header.dump();
}

// Moves the data section to start at `to`: from the end backwards when it
// moves up, from the start when it moves down, so no byte is overwritten
// before it is read.
void SafetensorsWriter::move_data(uint64_t to) {
  std::vector<char> buf(
      static_cast<size_t>(std::min(kMoveChunk, std::max<uint64_t>(data_bytes_, 1))));
  const uint64_t from = data_start_;
  for (uint64_t done = 0; done < data_bytes_;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), data_bytes_ - done);
    const uint64_t at = to > from ? data_bytes_ - done - n : done;
    if (!read_at(fd_, buf.data(), n, from + at))
      throw SafetensorsError(tmp_ + ": short read while moving its data (the file changed?)");
    write_at(fd_, buf.data(), n, to + at, path_);
    done += n;
  }
  data_start_ = to;
}

void SafetensorsWriter::finish() {
  if (fd_ < 0) throw SafetensorsError(path_ + ": finished twice");
  try {
    std::string h = header_text();
    const uint64_t need = round8(8 + h.size());
    if (need > data_start_ || (data_bytes_ <= kCompactBytes && data_start_ - need > kSlackBytes)) {
      move_data(need);
      if (::ftruncate(fd_, static_cast<off_t>(data_start_ + data_bytes_)) != 0)
        throw std::runtime_error("cannot truncate " + tmp_ + ": " + std::strerror(errno));
    }
    h.append(data_start_ - 8 - h.size(), ' ');  // the format's padding: data stays 8-aligned
    unsigned char le[8];
    const uint64_t len = h.size();
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(len >> (8 * i));
    write_at(fd_, le, 8, 0, path_);
    write_at(fd_, h.data(), h.size(), 8, path_);
    if (::fsync(fd_) != 0)
      throw std::runtime_error("cannot flush " + path_ + ": " + std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string err = std::strerror(errno);
      ::unlink(tmp_.c_str());
      throw std::runtime_error("cannot write " + path_ + ": " + err);
    }
  } catch (const SafetensorsError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw SafetensorsError(e.what());
  }
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // The header's exact size is known up front: no padding, nothing moved.
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  SafetensorsWriter out(path, metadata, 8 + header.dump().size());
  for (const auto& [name, t] : tensors) out.put(name, t);
  out.finish();
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& why) { return SafetensorsError(path + ": " + why); };
  uint64_t file_size = 0;
  try {
    fd_ = open_regular_for_reading(path, &file_size);
  } catch (const std::runtime_error& e) {
    throw fail(e.what());
  }
  const int fd = *fd_;
  if (file_size < 8)
    throw fail("too short to be a safetensors file (" + std::to_string(file_size) + " bytes)");
  unsigned char le[8];
  if (!read_at(fd, le, 8, 0)) throw fail("cannot read the header length (the file changed?)");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(le[i]) << (8 * i);
  if (header_len > kMaxHeader || header_len > file_size - 8)
    throw fail("header length " + std::to_string(header_len) + " exceeds the file (" +
               std::to_string(file_size) + " bytes) or the 100 MiB limit");
  std::string header(header_len, '\0');
  if (!read_at(fd, header.data(), header_len, 8))
    throw fail("cannot read the header (the file changed?)");
  nlohmann::json j;
  try {
    // Tensors nest 2 levels (name, then dtype/shape/offsets): 8 is generous.
    j = parse_json(header, "header", 8);
  } catch (const std::invalid_argument& e) {
    throw fail(std::string("header is not a JSON object (") + e.what() + ")");
  }
  if (!j.is_object()) throw fail("header is not a JSON object");
  const uint64_t data_size = file_size - 8 - header_len;

  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) throw fail("__metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw fail("__metadata__ values must be strings");
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& e = *it;
    const std::string& name = it.key();
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets") || !e["dtype"].is_string() || !e["shape"].is_array() ||
        !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
      throw fail("tensor \"" + name + "\" needs dtype, shape and two data_offsets");
    Entry en{name, at::kFloat, {}, 0, 0};
    const std::string dt = e["dtype"].get<std::string>();
    auto d = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                          [&](const DtypeName& x) { return dt == x.name; });
    if (d == std::end(kDtypes)) throw fail("tensor \"" + name + "\" has unsupported dtype " + dt);
    en.type = d->type;
    uint64_t numel = 1;
    for (const auto& s : e["shape"]) {
      if (!s.is_number_unsigned() && !(s.is_number_integer() && s.get<int64_t>() >= 0))
        throw fail("tensor \"" + name + "\" has a negative or non-integer dimension");
      const uint64_t dim = s.get<uint64_t>();
      // A shape is int64 in LibTorch: past that is no shape, even beside a 0.
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw fail("tensor \"" + name + "\" has a dimension past int64");
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim)
        throw fail("tensor \"" + name + "\" shape overflows");
      numel *= dim;
      en.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const auto& o : e["data_offsets"])
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
        throw fail("tensor \"" + name + "\" has invalid data_offsets");
    en.begin = e["data_offsets"][0].get<uint64_t>();
    en.end = e["data_offsets"][1].get<uint64_t>();
    const uint64_t elsize = c10::elementSize(en.type);
    if (numel > std::numeric_limits<uint64_t>::max() / elsize)
      throw fail("tensor \"" + name + "\" size overflows");
    if (en.end < en.begin || en.end > data_size)
      throw fail("tensor \"" + name + "\" data_offsets [" + std::to_string(en.begin) + ", " +
                 std::to_string(en.end) + ") lie outside the " + std::to_string(data_size) +
                 "-byte data section");
    if (en.end - en.begin != numel * elsize)
      throw fail("tensor \"" + name + "\" has " + std::to_string(en.end - en.begin) +
                 " bytes but its dtype and shape need " + std::to_string(numel * elsize));
    entries.push_back(std::move(en));
  }
  std::vector<const Entry*> sorted;  // empty tensors occupy no bytes and cannot overlap
  for (const auto& e : entries)
    if (e.end > e.begin) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i]->begin < sorted[i - 1]->end)
      throw fail("tensors \"" + sorted[i - 1]->name + "\" and \"" + sorted[i]->name + "\" overlap");
  data_start_ = 8 + header_len;
  for (auto& e : entries) entries_.emplace(e.name, std::move(e));
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

at::Tensor SafetensorsReader::read(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw SafetensorsError(path_ + ": no tensor \"" + name + "\"");
  const Entry& e = it->second;
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.type));
  if (!read_at(*fd_, t.data_ptr(), e.end - e.begin, data_start_ + e.begin))
    throw SafetensorsError(path_ + ": short read for tensor \"" + name + "\" (the file changed?)");
  return t;
}

const std::vector<int64_t>& SafetensorsReader::shape(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw SafetensorsError(path_ + ": no tensor \"" + name + "\"");
  return it->second.shape;
}

bool SafetensorsSet::contains(const std::string& name) const {
  return std::any_of(files_.begin(), files_.end(),
                     [&](const SafetensorsReader& f) { return f.contains(name); });
}

at::Tensor SafetensorsSet::read(const std::string& name) const {
  for (const auto& f : files_)
    if (f.contains(name)) return f.read(name);
  throw std::out_of_range("no tensor \"" + name + "\"");
}

SafetensorsFile read_safetensors(const std::string& path) {
  const SafetensorsReader reader(path);
  SafetensorsFile out;
  out.metadata = reader.metadata();
  for (const auto& name : reader.names()) out.tensors[name] = reader.read(name);
  return out;
}

}  // namespace tightfit
