// Progress of a phase that can take more than a few seconds (building a
// model, tokenizing data, scoring preference rows, generating, exporting),
// for a person at a terminal. The host sets where it goes; with no sink (a
// pipe, -q, a library user) a phase reports nothing and costs a branch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace tightfit {

struct ProgressUpdate {
  const std::string* phase;  // "building the model", "tokenizing rows.jsonl"
  const char* unit;          // "stages", "tokens", "bytes"
  int64_t done = 0, total = 0;
  double elapsed_s = 0;
  bool finished = false;  // the phase's last update
};

// The sink for every phase from now on (nullptr: none). Not thread-safe:
// set it before work starts.
void set_progress_sink(std::function<void(const ProgressUpdate&)> sink);
bool has_progress_sink();

// One phase: its start is reported at once, then at most ten updates a
// second, and its end when it goes out of scope.
class Progress {
 public:
  Progress(std::string phase, int64_t total, const char* unit);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void set(int64_t done);

 private:
  void report(bool finished);
  std::string phase_;
  const char* unit_;
  int64_t done_ = 0, total_;
  std::chrono::steady_clock::time_point start_, last_;
  bool active_;
};

}  // namespace tightfit
