// What the memory plan's timeline assumed of each declared stage; the
// step-time cost model and the routed-expert reads read the same.
#pragma once

#include <cstdint>

namespace tightfit {

struct StageFlow {
  bool backward = false;       // a gradient flows back through it
  bool recomputed = false;     // checkpointed: its forward runs again in its backward
  bool weights_train = false;  // weights of its own (not adapters) are trained
  int64_t kept_bytes = 0;      // activations it keeps for backward, as declared
  int64_t input_bytes = 0;     // recomputed: the input it keeps instead
};

// Without autograd a stage's intermediates go as soon as they are used:
// measured, about 0.6 of what it keeps for backward is alive at once (a
// no-gradient pass, a recompute's forward, a generation step).
constexpr int64_t live_without_autograd(int64_t kept_bytes) {
  return kept_bytes * 6 / 10;
}

}  // namespace tightfit
