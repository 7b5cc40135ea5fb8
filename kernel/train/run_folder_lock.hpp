// One run per run folder. Two processes training into one folder would
// interleave metrics.jsonl and race each other's checkpoints; the second is
// refused, naming the first one's pid. The lock is an advisory flock on
// RUN_DIR/.tightfit-run.lock, so it dies with the process that holds it (a
// crash or a kill never leaves a folder locked); the file stays, holding the
// pid of the last run that held it.
#pragma once

#include <memory>
#include <string>

namespace tightfit {

class RunFolderLock {
 public:
  // Throws std::runtime_error naming the folder, the other run's pid and
  // the fix when another process holds it, or when the lock file is a link
  // or cannot be made. Within one process, sessions on one folder share
  // the hold.
  static std::shared_ptr<RunFolderLock> acquire(const std::string& run_dir);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

  static constexpr const char* kFileName = ".tightfit-run.lock";

 private:
  explicit RunFolderLock(int fd) : fd_(fd) {}
  static std::shared_ptr<RunFolderLock> take(const std::string& run_dir);
  int fd_ = -1;
};

}  // namespace tightfit
