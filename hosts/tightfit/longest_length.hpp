// The longest length that fits, for `plan --longest-context` and `fit
// --longest-context`: what fits at one length fits at every shorter one, so
// doubling from the smallest step, then bisection, plans it about
// 2 log2(length / step) times.
#pragma once

#include <cstdint>

namespace tightfit::host {

// A context's length is searched to 256 tokens, up to 64M.
constexpr int64_t kContextStep = 256, kLongestContext = int64_t{1} << 26;

// The longest multiple of `step`, at most `most`, for which fits(length)
// holds (0: not even `step` does).
template <class Fits>
int64_t longest_length(Fits&& fits, int64_t step, int64_t most) {
  if (!fits(step)) return 0;
  int64_t good = step, bad = 2 * step;
  while (bad <= most && fits(bad)) good = bad, bad *= 2;
  if (bad > most) return good;
  while (bad - good > step) {
    const int64_t mid = (good + bad) / 2 / step * step;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

}  // namespace tightfit::host
