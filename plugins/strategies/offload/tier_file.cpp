#include "tier_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

namespace offload {
namespace {

constexpr size_t kBlock = 4096;              // O_DIRECT's unit on the file systems in use
constexpr size_t kBounce = size_t{4} << 20;  // the aligned buffer, per thread

size_t round_up(size_t n) {
  return (n + kBlock - 1) / kBlock * kBlock;
}

unsigned char* bounce_buffer() {
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<unsigned char, Free> buffer(
      static_cast<unsigned char*>(std::aligned_alloc(kBlock, kBounce)));
  if (!buffer) throw std::bad_alloc();
  return buffer.get();
}

[[noreturn]] void fail(const char* what, const std::string& path, int err) {
  throw std::runtime_error(std::string("offload: cannot ") + what + " " + path + ": " +
                           std::strerror(err) +
                           (err == ENOSPC ? " (disk full? set offload.dir to a larger disk)"
                                          : " (set offload.dir to a local disk this user owns)"));
}

[[noreturn]] void fail_short(const std::string& path, size_t bytes) {
  throw std::runtime_error("offload: " + path + " holds less than the " + std::to_string(bytes) +
                           " bytes this run wrote to it: it was changed or cut from outside "
                           "the run (start the run again)");
}

// Closes the file on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens with O_DIRECT (when *io asks for it), or without it where the file
// system refuses it; *io says which.
int open_file(const std::string& path, int flags, TierIo* io) {
  int fd = -1;
  if (*io == TierIo::kDirect) fd = ::open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0600);
  if (*io == TierIo::kBuffered || (fd < 0 && errno == EINVAL)) {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
    *io = TierIo::kBuffered;
  }
  return fd;
}

void write_all(int fd, const unsigned char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write", path, w < 0 ? errno : ENOSPC);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads up to `n` bytes; fewer only at the end of the file.
size_t read_up_to(int fd, unsigned char* p, size_t n, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("read", path, errno);
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kBlock == 0;
}

}  // namespace

const char* describe(TierIo io) {
  return io == TierIo::kDirect ? "written past the page cache"
                               : "written through the page cache: the file system refuses O_DIRECT";
}

TierIo write_tier_file(const std::string& path, const void* data, size_t bytes, TierIo io) {
  Fd f{open_file(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, &io)};
  if (f.fd < 0) fail("create", path, errno);
  const auto* src = static_cast<const unsigned char*>(data);
  if (io == TierIo::kBuffered) {
    write_all(f.fd, src, bytes, path);
    return io;
  }
  size_t done = 0;
  if (aligned(src)) {  // pinned host memory is page-aligned: no copy
    const size_t whole = bytes / kBlock * kBlock;
    write_all(f.fd, src, whole, path);
    done = whole;
  }
  unsigned char* buffer = bounce_buffer();
  while (done < bytes) {
    const size_t n = std::min(kBounce, bytes - done), padded = round_up(n);
    std::memcpy(buffer, src + done, n);
    std::memset(buffer + n, 0, padded - n);
    write_all(f.fd, buffer, padded, path);
    done += n;
  }
  if (round_up(bytes) != bytes && ::ftruncate(f.fd, static_cast<off_t>(bytes)) != 0)
    fail("write", path, errno);
  return io;
}

void read_tier_file(const std::string& path, void* data, size_t bytes, TierIo io) {
  Fd f{open_file(path, O_RDONLY | O_NOFOLLOW, &io)};
  if (f.fd < 0) fail("open", path, errno);
  auto* dst = static_cast<unsigned char*>(data);
  size_t done = 0;
  if (io == TierIo::kBuffered || aligned(dst)) {
    const size_t whole = io == TierIo::kBuffered ? bytes : bytes / kBlock * kBlock;
    done = read_up_to(f.fd, dst, whole, path);
    if (done < whole) fail_short(path, bytes);
  }
  unsigned char* buffer = bounce_buffer();
  while (done < bytes) {
    const size_t n = std::min(kBounce, bytes - done);
    if (read_up_to(f.fd, buffer, round_up(n), path) < n) fail_short(path, bytes);
    std::memcpy(dst + done, buffer, n);
    done += n;
  }
}

}  // namespace offload
