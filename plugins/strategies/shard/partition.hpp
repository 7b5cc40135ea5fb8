// How ZeRO splits a tensor across ranks: flattened, in world_size equal
// parts of `chunk` elements (the last padded), rank r owning elements
// [lo, lo + len). Equal parts are what reduce-scatter and all-gather move.
#pragma once

#include <algorithm>
#include <cstdint>

namespace shard {

struct Part {
  int64_t numel = 0;  // of the whole tensor
  int64_t chunk = 0;  // elements per rank, padding included
  int64_t lo = 0;     // this rank's first element
  int64_t len = 0;    // this rank's elements (chunk, less at the end, maybe 0)
};

inline Part part_of(int64_t numel, int rank, int world) {
  Part p;
  p.numel = numel;
  p.chunk = (numel + world - 1) / world;
  p.lo = std::min<int64_t>(numel, static_cast<int64_t>(rank) * p.chunk);
  p.len = std::min<int64_t>(p.chunk, numel - p.lo);
  return p;
}

}  // namespace shard
