#include "state_tier.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace offload {
namespace {

std::string file_name(const std::string& param) {
  std::string out = "optimizer-";
  for (char c : param)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_') ? c : '_';
  return out + ".bin";
}

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw std::runtime_error(
      "offload: " + what + " " + path + ": " + std::strerror(errno) +
      (errno == ENOSPC ? " (the disk tier's folder is full: free space or set offload.dir)" : ""));
}

}  // namespace

StateTier::Entry& StateTier::entry(const std::string& name, at::IntArrayRef shape,
                                   int32_t n_state) {
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    if (it->second.shape != shape.vec() || it->second.n_state != n_state)
      throw std::invalid_argument("offload: optimizer state of " + name + " changed shape");
    return it->second;
  }
  Entry e{shape.vec(), n_state, {}, {}};
  const int64_t bytes =
      n_state * c10::multiply_integers(shape) * static_cast<int64_t>(sizeof(float));
  if (kind_ == Kind::disk) {
    e.path = dir_ + "/" + file_name(name);
    const int fd = ::open(e.path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) fail("cannot create", e.path);
    // posix_fallocate reserves the blocks now, so a full disk shows here and not as SIGBUS later.
    const int rc = bytes > 0 ? ::posix_fallocate(fd, 0, bytes) : 0;
    ::close(fd);
    if (rc != 0) {
      errno = rc;
      fail("cannot reserve space for", e.path);
    }
  } else {
    std::vector<int64_t> full{n_state};
    full.insert(full.end(), shape.begin(), shape.end());
    e.host = at::zeros(full, at::TensorOptions().dtype(at::kFloat).pinned_memory(pinned_));
  }
  bytes_ += bytes;
  return entries_.emplace(name, std::move(e)).first->second;
}

void StateTier::with_state(const std::string& name, at::IntArrayRef shape, int32_t n_state,
                           const std::function<void(std::vector<at::Tensor>&)>& fn) {
  Entry& e = entry(name, shape, n_state);
  std::vector<at::Tensor> slots;
  if (kind_ == Kind::host) {
    for (int32_t i = 0; i < n_state; ++i) slots.push_back(e.host[i]);
    fn(slots);
    return;
  }
  const int64_t numel = c10::multiply_integers(shape);
  const size_t bytes = static_cast<size_t>(n_state * numel) * sizeof(float);
  if (bytes == 0) {
    fn(slots);
    return;
  }
  const int fd = ::open(e.path.c_str(), O_RDWR);
  if (fd < 0) fail("cannot open", e.path);
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) fail("cannot map", e.path);
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, bytes};
  for (int32_t i = 0; i < n_state; ++i)
    slots.push_back(at::from_blob(static_cast<float*>(map) + i * numel, shape, at::kFloat));
  fn(slots);  // the unmap ends residency; the page cache writes the file back
}

std::vector<std::string> StateTier::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

}  // namespace offload
