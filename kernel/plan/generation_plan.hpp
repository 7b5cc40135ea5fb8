// What a schedule's sampling holds (the host's generate, completion_sampler):
// a moment of its own, outside the training pass, when the weights, adapters
// and optimizer state are alive but no gradient or kept activation is.
//   decode cache  rows x (prompt + new tokens) x the stages' declared cache
//                 bytes per token, plus their recurrent state per row, and one
//                 block's cache again while it grows by a token (a copy);
//   workspace     the larger of a prefill piece (prefill_chunk_tokens of the
//                 prompt: its logits and a block's intermediates; of each
//                 prompt once where the model fans a cache out to its rows)
//                 and a sampling step (the rows' logits, their softmax and
//                 sort).
// A model without decode recomputes the whole context each token: no cache,
// and that context's forward and logits as the workspace.
#pragma once

#include <cstdint>

namespace tightfit {

struct KernelParts;

struct GenerationPlan {
  int64_t rows = 0, prompt_tokens = 0, new_tokens = 0;
  int64_t prefill_rows = 0;  // the rows prefilled together: the prompts', or every row
  bool incremental = true;   // the model has decode (a cache); else each step recomputes
  int64_t cache = 0;         // the decode cache at its longest, with one block's growth
  int64_t workspace = 0;     // the prefill piece's or a sampling step's, the larger
  int64_t bytes() const { return cache + workspace; }
};

// `rows` decoded together, each `new_tokens` after a `prompt_tokens` prompt;
// they complete `prompts` prompts (0: each row its own).
GenerationPlan plan_generation(const KernelParts& kernel, int64_t rows, int64_t prompts,
                               int64_t prompt_tokens, int64_t new_tokens);

}  // namespace tightfit
