// The process's resident memory as the operating system counts it, beside
// the tensor bytes tightfit tracks: the libraries' code and heap, the
// allocator's retained pages and memory-mapped files are in the first and
// not in the second. A person simulating a 4 GiB card, or training on a
// 16 GiB laptop, needs both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tightfit {

struct ProcessMemory {
  int64_t rss = 0;       // resident now (VmRSS)
  int64_t peak_rss = 0;  // the most resident since the process started (VmHWM)
  int64_t rss_anon = 0;  // heap and anonymous maps: tensors, allocator retention (RssAnon)
  int64_t rss_file = 0;  // file pages: libraries' code, memory-mapped weights and tiers (RssFile)
};

// nullopt where the system does not say (no /proc/self/status).
std::optional<ProcessMemory> read_process_memory();

// Gives the heap's free pages back to the system (glibc's malloc_trim): after
// set-up, whose transient peak (weights read and converted stage by stage)
// the allocator would otherwise keep for the whole run.
void release_free_heap();

// What the process holds beyond the tracked tensor bytes, by category, from
// the RSS before the session was built (`at_start`, the libraries) and at its
// peak; "" when either is unknown.
std::string describe_process_memory(const ProcessMemory& at_start, const ProcessMemory& peak,
                                    int64_t tracked_peak, int64_t mapped_file_growth);

}  // namespace tightfit
