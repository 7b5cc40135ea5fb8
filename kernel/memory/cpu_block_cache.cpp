#include "cpu_block_cache.hpp"

#include <algorithm>
#include <bit>
#include <utility>

namespace tightfit {

int64_t CpuBlockCache::capacity_for(int64_t bytes) {
  if (bytes < kSmallest) return bytes;
  const int64_t step = int64_t{1} << (std::bit_width(static_cast<uint64_t>(bytes)) - 1 - 3);
  return (bytes + step - 1) / step * step;
}

c10::DataPtr CpuBlockCache::take(int64_t capacity) {
  std::lock_guard<std::mutex> lock(m_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->capacity == capacity) {
      c10::DataPtr block = std::move(it->block);
      cached_ -= capacity;
      live_ += capacity;  // cached + live unchanged: within the mark
      entries_.erase(it);
      return block;
    }
  return {};
}

void CpuBlockCache::add_fresh(int64_t capacity) {
  std::list<Entry> dropped;  // freed after the lock is released
  std::lock_guard<std::mutex> lock(m_);
  live_ += capacity;
  high_water_ = std::max(high_water_, live_);
  drop_past_high_water(dropped);
}

void CpuBlockCache::put(int64_t capacity, c10::DataPtr block) {
  std::list<Entry> dropped;  // freed after the lock is released
  {
    if (capacity < kSmallest) return;  // never counted live: `block` frees itself
    std::lock_guard<std::mutex> lock(m_);
    live_ -= capacity;
    if (capacity > limit_) return;  // `block` frees itself
    entries_.push_front(Entry{capacity, std::move(block)});
    cached_ += capacity;
    drop_past_limit(dropped);
  }
}

void CpuBlockCache::release_all() {
  std::list<Entry> dropped;
  std::lock_guard<std::mutex> lock(m_);
  dropped.swap(entries_);
  cached_ = 0;
  high_water_ = live_;
}

void CpuBlockCache::set_limit(int64_t bytes) {
  std::list<Entry> dropped;
  std::lock_guard<std::mutex> lock(m_);
  limit_ = bytes;
  drop_past_limit(dropped);
}

void CpuBlockCache::drop_past_limit(std::list<Entry>& dropped) {
  while (cached_ > limit_) drop_oldest(dropped);
}

void CpuBlockCache::drop_past_high_water(std::list<Entry>& dropped) {
  while (cached_ > 0 && cached_ + live_ > mark()) drop_oldest(dropped);
}

void CpuBlockCache::drop_oldest(std::list<Entry>& dropped) {
  cached_ -= entries_.back().capacity;
  dropped.splice(dropped.begin(), entries_, std::prev(entries_.end()));
}

int64_t CpuBlockCache::mark() const {
  return high_water_ + std::min(limit_, high_water_ / 8);
}

int64_t CpuBlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(m_);
  return cached_;
}

int64_t CpuBlockCache::live_bytes() const {
  std::lock_guard<std::mutex> lock(m_);
  return live_;
}

CpuBlockCache& cpu_block_cache() {
  static auto* cache = new CpuBlockCache();  // never destroyed: frees may come late
  return *cache;
}

}  // namespace tightfit
