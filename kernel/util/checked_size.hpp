// Sizes from outside (config.json shapes, recipe batch and sequence sizes,
// plugins' declarations) meet in products — elements of a parameter, bytes
// of the logits for a batch — that can pass int64 and wrap into a small
// number that "fits". Every such product goes through checked_product: past
// kMaxPlannedBytes it is an error naming the term, never a wrapped value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "recipe_error.hpp"

namespace tightfit {

// 2^56 bytes (64 PiB): far past any machine, and small enough that sums of
// a few hundred such terms stay inside int64.
constexpr int64_t kMaxPlannedBytes = int64_t{1} << 56;

// The product of `factors` (each >= 0), or a RecipeError naming `what` when
// it passes kMaxPlannedBytes.
inline int64_t checked_product(std::initializer_list<int64_t> factors, const std::string& what) {
  int64_t out = 1;
  for (const int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(out, f, &out) || out > kMaxPlannedBytes)
      throw RecipeError(what + " passes 64 PiB (" + std::to_string(kMaxPlannedBytes) +
                        "): a size in the model's config.json or the recipe is absurd for any "
                        "machine; check hidden and vocabulary sizes, data.batch_size and "
                        "data.seq_len");
  }
  return out;
}

}  // namespace tightfit
