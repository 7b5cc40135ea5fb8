// What one pass sets while it runs, its backward included, and nothing
// after: the rows every stage is handed, the head whose projection runs
// fused with the loss, where the model's loss terms go (or who refuses
// them), the weight of their gradient, and the device the running stage
// computes on. A pass entry of the Executor makes one as a local, from the
// pass it runs in, and the Executor reads it through the pass's calls back
// into the kernel (a model's add_loss_term, a weight's fetch) until the
// entry returns; a stage, a recomputation or a loss head narrows it the
// same way.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "pass_request.hpp"

namespace tightfit {

struct PassScope {
  PassRows rows;            // on the run's device
  int32_t fused_head = -1;  // the head asked for its hidden state (the loss fused with it)
  std::vector<at::Tensor>* terms = nullptr;  // the model's loss terms this pass takes
  // A checkpointed stage rerun in backward: its terms (only their gradient is new).
  std::vector<at::Tensor>* recompute_terms = nullptr;
  const char* terms_refused_by = nullptr;    // a pass that takes none (log-probs)
  double term_weight = 1.0;                  // the weight of the terms' gradient
  std::optional<at::Device> compute_device;  // the running stage's: where its weights go
};

}  // namespace tightfit
