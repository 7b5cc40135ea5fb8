#include "file_util.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

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

void write_file_synced(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out || !(out << text) || !out.flush()) throw std::runtime_error("cannot write " + path);
  }
  fsync_path(path);
}

}  // namespace tightfit
