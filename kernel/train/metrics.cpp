#include "metrics.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "file_util.hpp"
#include "input_files.hpp"
#include "json_output.hpp"

namespace tightfit {

namespace {

constexpr size_t kMaxRowBytes = size_t{1} << 20;

// The byte offset just past the last row of `fd` whose step is at most
// `step`: rows are written in step order (a rolled-back step's row comes
// before the steps after the checkpoint it rolled back to), so the first row
// past it, or a line a crash cut short, ends what a resume keeps.
off_t end_of_rows_through(int fd, int64_t step, const std::string& path) {
  std::string line;
  off_t offset = 0, kept = 0;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot read metrics file " + path + ": " + std::strerror(errno));
    }
    if (n == 0) return kept;  // a last line without its newline was cut short
    for (ssize_t k = 0; k < n; ++k) {
      ++offset;
      if (buf[k] != '\n') {
        if (line.size() >= kMaxRowBytes) return kept;  // no row of ours is this long
        line += buf[k];
        continue;
      }
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!row.is_object() || !row.contains("step") || !row["step"].is_number_integer() ||
          row["step"].get<int64_t>() > step)
        return kept;
      kept = offset;
      line.clear();
    }
  }
}

// A new file at `path` holding the first `keep` bytes of `fd`'s, written
// beside it and renamed over the name: a file another hard link names keeps
// its bytes. Returns the new file's descriptor, open for appending.
int own_copy(int fd, off_t keep, const std::string& path) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int out =
      ::open(tmp.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (out < 0)
    throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno) +
                             (errno == EEXIST ? " (something is in the way: remove it)" : ""));
  try {
    char buf[1 << 16];
    for (off_t at = 0; at < keep;) {
      const size_t want = static_cast<size_t>(std::min<off_t>(keep - at, sizeof buf));
      if (!read_at(fd, buf, want, static_cast<uint64_t>(at)))
        throw std::runtime_error("cannot read metrics file " + path);
      write_all(out, buf, want, tmp);
      at += static_cast<off_t>(want);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw std::runtime_error("cannot replace metrics file " + path + ": " + std::strerror(errno));
  } catch (...) {
    ::close(out);
    ::unlink(tmp.c_str());
    throw;
  }
  return out;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, int64_t resumed_at_step) : path_(path) {
  const bool resumed = resumed_at_step > 0;
  // O_NONBLOCK: a FIFO planted there must not block the open; it is then
  // refused, as anything but a regular file is.
  fd_ = ::open(path.c_str(),
               (resumed ? O_RDWR : O_WRONLY) | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK |
                   (resumed ? O_APPEND : 0),
               0644);
  if (fd_ < 0 && (errno == ELOOP || errno == ENXIO))
    throw InputError("cannot open metrics file " + path + ": " +
                     (errno == ELOOP ? "it is a symbolic link, which tightfit does not write "
                                       "through; remove it"
                                     : "it is not a regular file; move it away"));
  if (fd_ < 0)
    throw std::runtime_error("cannot open metrics file " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw InputError("cannot open metrics file " + path +
                     ": it is not a regular file; move it away");
  }
  try {
    const off_t keep = resumed ? end_of_rows_through(fd_, resumed_at_step, path) : 0;
    if (st.st_nlink > 1) {
      // Another name shares the file: cutting or appending in place would
      // change that file too. The rows kept go to a file of this run's own.
      const int own = own_copy(fd_, keep, path);
      ::close(fd_);
      fd_ = own;
      return;
    }
    if (::ftruncate(fd_, keep) != 0)
      throw std::runtime_error((resumed ? "cannot cut metrics file " + path +
                                              " back to the rows of steps 1.." +
                                              std::to_string(resumed_at_step)
                                        : "cannot start metrics file " + path) +
                               ": " + std::strerror(errno));
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

// One write(2) a record where it fits: a reader rarely sees half a line.
bool MetricsWriter::write(const nlohmann::json& record) {
  if (fd_ < 0) return true;
  const std::string line = dump_json(record) + '\n';
  try {
    write_all(fd_, line.data(), line.size(), path_);
  } catch (const std::runtime_error& e) {
    error_ = std::string(e.what()) + "; the run goes on without its metrics rows";
    ::close(fd_);
    fd_ = -1;
    return false;
  }
  return true;
}

}  // namespace tightfit
