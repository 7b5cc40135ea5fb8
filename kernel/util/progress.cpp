#include "progress.hpp"

#include <utility>

namespace tightfit {
namespace {

std::function<void(const ProgressUpdate&)>& sink() {
  static std::function<void(const ProgressUpdate&)> s;
  return s;
}

}  // namespace

void set_progress_sink(std::function<void(const ProgressUpdate&)> s) {
  sink() = std::move(s);
}

bool has_progress_sink() {
  return static_cast<bool>(sink());
}

Progress::Progress(std::string phase, int64_t total, const char* unit)
    : phase_(std::move(phase)), unit_(unit), total_(total), active_(has_progress_sink()) {
  if (!active_) return;
  start_ = last_ = std::chrono::steady_clock::now();
  report(false);
}

Progress::~Progress() {
  if (!active_) return;
  try {
    report(true);
  } catch (...) {
    // A sink that fails leaves the work as it was.
  }
}

void Progress::set(int64_t done) {
  done_ = done;
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  report(false);
}

void Progress::report(bool finished) {
  const ProgressUpdate u{
      &phase_,
      unit_,
      done_,
      total_,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(),
      finished};
  sink()(u);
}

}  // namespace tightfit
