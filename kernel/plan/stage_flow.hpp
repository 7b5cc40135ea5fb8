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

}  // namespace tightfit
