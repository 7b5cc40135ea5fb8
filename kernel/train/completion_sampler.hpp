// Sampling the next token of many rows at once, and prompts' completions
// sampled together: n rows of each prompt through one batched decode, each
// ending at its first stop id. Prompts of different lengths are
// left-padded to the longest where the model decodes rows that begin at
// different columns (decode_rows, ABI 1.27), and sampled one after another
// where it does not. Online RL's generation (the host's generate service)
// and `tightfit generate` sample with the same rule.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace tightfit {

struct KernelParts;

// transformers' processors in generate's order: the repetition penalty,
// then the warpers temperature, top-k, top-p and min-p.
struct SamplingRule {
  double temperature = 1.0;         // 0: greedy
  int64_t top_k = 0;                // 0: every token; 1: greedy
  double top_p = 1.0;               // 1: off
  double min_p = 0.0;               // 0: off
  double repetition_penalty = 1.0;  // 1: off
};

// The next token of each row of `logits` ([R, V], any device and dtype):
// int64 [R] on the CPU, drawn with `generator`. `context` (int64 [R, L]:
// each row's ids so far) is what the repetition penalty reads.
at::Tensor sample_next_tokens(const at::Tensor& logits, const SamplingRule& rule,
                              at::Generator& generator, const at::Tensor& context = {});

// The prompt's tokens a decode call takes at once (at least 1): the model's
// decode returns logits for every new position, and `rows` x that many x
// `vocab` fp32 logits stay within kPrefillLogitsBytes (a 1,024-token prompt
// of 8 rows would be 5 GiB of Qwen3's logits in one call).
inline constexpr int64_t kPrefillLogitsBytes = int64_t{128} << 20;
int64_t prefill_chunk_tokens(int64_t rows, int64_t vocab,
                             int64_t logits_bytes = kPrefillLogitsBytes);

struct CompletionRequest {
  std::vector<std::vector<int64_t>> prompts;  // each at least one id
  // One per prompt: its rows are drawn from a generator seeded with it, so a
  // prompt's completions do not depend on the prompts beside it.
  std::vector<uint64_t> seeds;
  int64_t n = 1;  // completions of each prompt
  int64_t max_new_tokens = 1;
  SamplingRule rule;
  std::vector<int64_t> stop_ids;  // a completion ends with the first it samples (kept)
  int64_t prefill_logits_bytes = kPrefillLogitsBytes;  // a prefill piece's logits at most
  bool use_cache = true;  // false: every token recomputes the whole context (no decode)
  std::function<void(int64_t)> on_token;  // after each token, with the tokens so far
};

// Rows: prompt 0's n completions, then prompt 1's, ...
struct Completions {
  at::Tensor ids;      // int64 [rows, C] on the CPU: each completion, then `pad`
  at::Tensor lengths;  // int64 [rows]
  int64_t pad = 0;
};

// No gradients; the key/value cache (or each step's whole context, for a
// model without decode) is transient memory. Throws std::invalid_argument
// for bad values, and what the model throws (a context past its positions).
Completions sample_completions(const KernelParts& kernel, const CompletionRequest& request,
                               int64_t pad_id);

}  // namespace tightfit
