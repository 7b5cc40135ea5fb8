#include "file_util.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "input_files.hpp"

namespace tightfit {

namespace {
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path);
}
}  // namespace

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // nothing there
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    throw std::runtime_error("cannot remove " + path + ": " + std::strerror(errno));
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string read_file_text(const std::string& path) {
  return read_regular_file(path, std::numeric_limits<size_t>::max());
}

std::string read_regular_file(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw std::runtime_error("cannot stat " + path);
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw std::runtime_error(path + " is " + std::to_string(st.st_size) + " bytes, over the " +
                             std::to_string(max_bytes) + " a file of its kind can be");
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the file shrank: keep what was read
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void write_at(int fd, const void* data, uint64_t n, uint64_t offset, const std::string& path) {
  const char* c = static_cast<const char*>(data);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
    const ssize_t w = ::pwrite(fd, c, chunk, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
    c += w, n -= static_cast<uint64_t>(w), offset += static_cast<uint64_t>(w);
  }
}

void create_empty_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path + ": " + std::strerror(errno));
  ::close(fd);
}

void write_file_replacing(const std::string& path, const std::function<void(int fd)>& fill) {
  refuse_output_over_inputs(path, /*folder=*/false, "a file");
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno) +
                             (errno == EEXIST ? " (something is in the way: remove it)" : ""));
  try {
    fill(fd);
    if (::fsync(fd) != 0)
      throw std::runtime_error("cannot flush " + path + ": " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + err);
  }
}

void write_file_synced(const std::string& path, const std::string& text) {
  write_file_replacing(path, [&](int fd) { write_all(fd, text.data(), text.size(), path); });
}

std::shared_ptr<const int> open_regular_for_reading(const std::string& path, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(std::string("cannot open: ") + std::strerror(errno));
  std::shared_ptr<const int> owned(new int(fd), [](const int* f) {
    ::close(*f);
    delete f;
  });
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw std::runtime_error("cannot stat");
  if (!S_ISREG(st.st_mode)) throw std::runtime_error("not a regular file");
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  *size = static_cast<uint64_t>(st.st_size);
  return owned;
}

bool read_at(int fd, void* dst, uint64_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
    const ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got, n -= static_cast<uint64_t>(got), offset += static_cast<uint64_t>(got);
  }
  return true;
}

}  // namespace tightfit
