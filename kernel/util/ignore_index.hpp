// The target id a loss skips, shared by the data that makes targets and
// the losses that read them.
#pragma once

#include <cstdint>

namespace tightfit {

// A target that is not trained on (a prompt token, padding), as PyTorch's
// and Hugging Face's ignore_index.
constexpr int64_t kIgnoreIndex = -100;

}  // namespace tightfit
