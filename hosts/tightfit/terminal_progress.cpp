#include "terminal_progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "byte_size.hpp"
#include "commands.hpp"
#include "progress.hpp"

namespace tightfit::host {
namespace {

std::string amount(int64_t n, const std::string& unit) {
  return unit == "bytes" ? format_bytes(n) : std::to_string(n);
}

void draw(const ProgressUpdate& u) {
  const std::string unit = u.unit;
  std::string line = "\r\033[K" + *u.phase + ": " + amount(u.done, unit);
  if (u.total > 0) {
    char pct[16];
    std::snprintf(pct, sizeof pct, " (%.0f%%)",
                  100.0 * static_cast<double>(u.done) / static_cast<double>(u.total));
    line += " of " + amount(u.total, unit) + (unit == "bytes" ? "" : " " + unit) + pct;
  } else if (unit != "bytes") {
    line += " " + unit;
  }
  char took[32];
  std::snprintf(took, sizeof took, ", %.0f s", u.elapsed_s);
  line += took;
  if (u.finished) {
    // A phase that took a while keeps its line; a quick one leaves none.
    if (u.elapsed_s < 2.0) {
      line = "\r\033[K";
    } else {
      std::snprintf(took, sizeof took, "%.1f s", u.elapsed_s);
      line = "\r\033[K" + *u.phase + ": " + amount(u.done, unit) +
             (unit == "bytes" ? "" : " " + unit) + " in " + took + "\n";
    }
  }
  std::fflush(stdout);  // the line goes under what was printed before it
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void show_progress_on_terminal(bool quiet) {
  if (quiet || ::isatty(STDERR_FILENO) == 0) {
    set_progress_sink(nullptr);
    return;
  }
  set_progress_sink(draw);
}

}  // namespace tightfit::host
