#include "run_folder_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>

#include "input_files.hpp"

namespace tightfit {

std::shared_ptr<RunFolderLock> RunFolderLock::acquire(const std::string& run_dir) {
  // Sessions of one process share its hold (a program comparing two runs
  // keeps both alive): the lock is against other processes. flock is per
  // open file, so a second open in this process would refuse this process.
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<RunFolderLock>> held;
  std::error_code ec;
  std::string key = std::filesystem::weakly_canonical(run_dir, ec).string();
  if (ec) key = std::filesystem::absolute(run_dir).string();
  const std::lock_guard<std::mutex> lock(mutex);
  if (auto mine = held[key].lock()) return mine;
  auto made = take(run_dir);
  held[key] = made;
  return made;
}

std::shared_ptr<RunFolderLock> RunFolderLock::take(const std::string& run_dir) {
  const std::string path = (std::filesystem::path(run_dir) / kFileName).string();
  // Never through a link planted at the lock's name; never inherited by the
  // children tightfit starts (they exec).
  // O_NONBLOCK: a FIFO planted there must not block the open.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0 && errno == ELOOP)
    throw InputError("cannot open the run folder's lock " + path +
                     ": it is a symbolic link, which tightfit does not write through; remove it");
  if (fd < 0)
    throw std::runtime_error("cannot open the run folder's lock " + path + ": " +
                             std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError("cannot open the run folder's lock " + path +
                     ": it is not a regular file; move it away");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK)
      throw std::runtime_error("cannot lock the run folder " + run_dir + ": " + std::strerror(err));
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    pid.erase(pid.find_last_not_of(" \n") + 1);
    throw std::runtime_error(
        "the run folder " + run_dir + " is in use by another tightfit run" +
        (pid.empty() ? std::string() : " (pid " + pid + ")") +
        ": one run trains into one folder. Wait for it to finish (or stop it), or give this "
        "run its own folder with [run] name or out_dir");
  }
  // The pid, for the message of a run that finds the folder in use; not
  // when another name shares the file (a hard link): writing it would change
  // that file too. The lock holds without its note.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (st.st_nlink == 1 &&
      (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0)) {
    // The lock holds without its note; the other run's message just lacks the pid.
  }
  return std::shared_ptr<RunFolderLock>(new RunFolderLock(fd));
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace tightfit
