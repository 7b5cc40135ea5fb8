#include "process_memory.hpp"

#include <malloc.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "byte_size.hpp"

namespace tightfit {

std::optional<ProcessMemory> read_process_memory() {
  // A regular file the kernel writes for us; its lines are "VmRSS:  1234 kB".
  std::ifstream in("/proc/self/status");
  if (!in) return std::nullopt;
  ProcessMemory m;
  bool any = false;
  std::string line;
  while (std::getline(in, line)) {
    int64_t* field = nullptr;
    if (line.rfind("VmRSS:", 0) == 0)
      field = &m.rss;
    else if (line.rfind("VmHWM:", 0) == 0)
      field = &m.peak_rss;
    else if (line.rfind("RssAnon:", 0) == 0)
      field = &m.rss_anon;
    else if (line.rfind("RssFile:", 0) == 0)
      field = &m.rss_file;
    if (!field) continue;
    std::istringstream fields(line.substr(line.find(':') + 1));
    int64_t kib = 0;
    if (fields >> kib) {
      *field = kib * 1024;
      any = true;
    }
  }
  if (!any) return std::nullopt;
  m.peak_rss = std::max(m.peak_rss, m.rss);
  return m;
}

void release_free_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

std::string describe_process_memory(const ProcessMemory& at_start, const ProcessMemory& peak,
                                    int64_t tracked_peak, int64_t mapped_file_growth) {
  if (peak.peak_rss <= 0 || at_start.rss <= 0) return "";
  const int64_t mapped = std::max<int64_t>(0, mapped_file_growth);
  const int64_t rest = peak.peak_rss - at_start.rss - tracked_peak - mapped;
  std::ostringstream os;
  os << format_bytes(peak.peak_rss) << " = libraries and runtime " << format_bytes(at_start.rss)
     << " (before the run was built) + tracked tensors " << format_bytes(tracked_peak);
  if (mapped > 0) os << " + memory-mapped file pages " << format_bytes(mapped);
  if (rest >= 0)
    os << " + heap the allocator kept and untracked buffers " << format_bytes(rest);
  else  // tensors allocated and never touched count as tracked but were never resident
    os << " - tracked bytes never made resident " << format_bytes(-rest);
  return os.str();
}

}  // namespace tightfit
