// Freed large CPU blocks kept for the next allocation of their size class.
//
// glibc hands every block above its mmap threshold (32 MiB at most) fresh
// pages from the kernel and unmaps them on free, so a weight dequantized,
// cast or read from a disk tier once per pass costs the kernel's page faults
// and zeroing every time: 27% of a 7B QLoRA step's CPU time. The same sizes
// come back layer after layer, so a block freed now is handed out again
// instead, as CUDA's caching allocator does for device memory. The cache is
// bounded ([run] cpu_block_cache) and its bytes are resident but untracked:
// `tightfit run` counts them in the process's memory, not in the budget.
//
// Nor does it raise the process's peak by more than an eighth: cached and
// live blocks together stay within the most the live blocks have needed and
// an eighth of that (at most the limit). When a longer batch asks for sizes
// the cache does not hold, stale blocks are freed as fresh ones come (a DPO
// run kept 430 MiB of the shorter batches' activations beside the longer
// batch's: 1.05x TRL's peak RSS). The eighth is what keeps the cache useful
// while the live bytes climb to a new high (a first step's forward saving
// its inputs, a set-up making layer after layer): at the mark exactly, every
// fresh block, however small, pushed out the oldest cached one, however
// large, which was the next layer's weight, so a 7B QLoRA run faulted in and
// zeroed 26 GB of pages in its set-up and first step (6.5 million faults;
// 1.1 million with the eighth, and the first step 9 s sooner).
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <list>
#include <mutex>

namespace tightfit {

class CpuBlockCache {
 public:
  // Blocks smaller than this come from the heap's free lists anyway.
  static constexpr int64_t kSmallest = int64_t{1} << 20;

  // The capacity a block for `bytes` is allocated with: `bytes` rounded up to
  // an eighth of its power of two (at most 12.5% more), so the varying sizes
  // of one tensor shape share a class. `bytes` itself below kSmallest.
  static int64_t capacity_for(int64_t bytes);

  // A cached block of exactly `capacity` bytes, now live, or an empty DataPtr.
  c10::DataPtr take(int64_t capacity);
  // A block of `capacity` bytes the caller allocated fresh after a miss is
  // live: the least recently freed cached blocks are freed until cached and
  // live bytes together fit within the live high-water mark. The caller
  // passes only blocks of kSmallest bytes or more, here and to put().
  void add_fresh(int64_t capacity);
  // A live block of `capacity` bytes was freed: kept, dropping the least
  // recently freed ones past the limit, or freed at once when the cache is
  // off or the block alone is past the limit.
  void put(int64_t capacity, c10::DataPtr block);
  // Frees every cached block (the process budget needs its pages back) and
  // starts the high-water mark again from the live bytes.
  void release_all();

  void set_limit(int64_t bytes);
  int64_t cached_bytes() const;
  int64_t live_bytes() const;

 private:
  struct Entry {
    int64_t capacity;
    c10::DataPtr block;
  };
  // Move the least recently freed entries into `dropped` (freed by the
  // caller once the lock is released): past the limit, or past the live
  // high-water mark.
  void drop_past_limit(std::list<Entry>& dropped);
  void drop_past_high_water(std::list<Entry>& dropped);
  void drop_oldest(std::list<Entry>& dropped);
  // What cached and live blocks may hold together: the live high-water mark
  // and an eighth of it (at most the limit).
  int64_t mark() const;

  mutable std::mutex m_;
  std::list<Entry> entries_;  // most recently freed first
  int64_t cached_ = 0;
  int64_t limit_ = 0;
  int64_t live_ = 0;        // capacities of the blocks handed out, not yet freed
  int64_t high_water_ = 0;  // the most live_ has been
};

CpuBlockCache& cpu_block_cache();

}  // namespace tightfit
