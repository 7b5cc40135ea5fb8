// A structure-aware mode shared by the fuzz targets: libFuzzer's inputs are
// short (-max_len), so on their own they never reach JSON nested thousands
// deep or a piece of text a megabyte long. An input that starts with 0xFE
// is instead a recipe for a large one:
//
//   0xFE, e, extra, prefix length, prefix, unit length, unit, tail
//
// becomes prefix + unit x count + tail, count = 2^(e % 21) + extra: up to a
// million repeats of a unit ("[", "{\"a\":", "ab") between a prefix and a
// tail that mutate like any other bytes. The count is on a log scale so that
// most mutations stay small and fast while the largest sizes (a megabyte of
// units) stay one byte away. Any other input is used as it is.
// $TIGHTFIT_FUZZ_MAX_EXPAND (bytes) caps what an input expands to: CI's short
// run sets 256 KiB (every seed fits) so that its fixed number of runs takes
// a bounded time; the long runs leave it unset.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

inline std::string expand_input(const uint8_t* data, size_t size) {
  if (size < 5 || data[0] != 0xFE) return std::string(reinterpret_cast<const char*>(data), size);
  size_t at = 1;
  size_t count = (size_t{1} << (data[1] % 21)) + data[2];
  at = 3;
  auto take = [&](size_t n) {
    n = std::min(n, size - at);
    std::string s(reinterpret_cast<const char*>(data + at), n);
    at += n;
    return s;
  };
  const std::string prefix = take(data[at++]);
  if (at >= size) return prefix;
  const std::string unit = take(data[at++] % 16 + 1u);
  static const size_t max_expand = [] {
    const char* cap = std::getenv("TIGHTFIT_FUZZ_MAX_EXPAND");
    return cap ? static_cast<size_t>(std::strtoull(cap, nullptr, 10)) : SIZE_MAX;
  }();
  if (!unit.empty()) count = std::min(count, max_expand / unit.size());
  std::string out = prefix;
  out.reserve(prefix.size() + unit.size() * count + (size - at));
  for (size_t i = 0; i < count; ++i) out += unit;
  out += take(size - at);
  return out;
}
