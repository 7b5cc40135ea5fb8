// How generation picks each next token: the options of `tightfit generate`
// and of Session::generate.
#pragma once

#include <cstdint>
#include <vector>

namespace tightfit {

struct SamplingOptions {
  int64_t n_tokens = 0;
  int64_t top_k = 0;         // 0 = every token, 1 = greedy
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;        // 1 = off, 0 = the likeliest token
  uint64_t seed = 0;
  bool use_cache = true;          // the model's incremental decode, when it has one
  std::vector<int64_t> stop_ids;  // end-of-sequence tokens: stop there, leaving it out
  // The tokenizer's post-processor (BOS/EOS) around the prompt, as
  // tokenizer(prompt) does; false for a prompt rendered by a chat template.
  bool add_special_tokens = true;
  double min_p = 0.0;               // 0 = off; else below min_p x the likeliest's probability goes
  double repetition_penalty = 1.0;  // 1 = off; transformers' penalty over the prompt and output
};

}  // namespace tightfit
