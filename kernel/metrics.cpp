#include "metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "file_util.hpp"
#include "json_output.hpp"

namespace tightfit {

MetricsWriter::MetricsWriter(const std::string& path, bool resumed) : path_(path) {
  fd_ = ::open(path.c_str(),
               O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | (resumed ? O_APPEND : O_TRUNC), 0644);
  if (fd_ < 0)
    throw std::runtime_error("cannot open metrics file " + path + ": " +
                             (errno == ELOOP ? std::string("it is a symbolic link, which tightfit "
                                                           "does not write through")
                                             : std::string(std::strerror(errno))));
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
