// JSONL metrics: one JSON object per line, flushed as written so a crashed run
// keeps every completed step.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace tightfit {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens `path`: a fresh run (`resumed_at_step` 0) starts it empty (never
  // after an earlier run's rows); a run resumed from the checkpoint of step
  // S continues it after the rows of steps 1..S, so the rows a crashed run
  // wrote past that checkpoint (the steps it runs again) and a line a crash
  // cut short are dropped, as the file stood when that checkpoint was saved.
  // A symbolic link at `path` is refused, never written through.
  MetricsWriter(const std::string& path, int64_t resumed_at_step);
  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();

  // False when the record could not be written (disk full, a file size
  // limit): the file is closed then and later records are dropped, so the
  // caller says so once (error() says why); the run itself goes on.
  bool write(const nlohmann::json& record);
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string error_;
  int fd_ = -1;
};

}  // namespace tightfit
