// What a schedule that samples its own completions (online RL, ABI 1.25)
// asks the host for: a batch of prompts, each prompt's completions sampled
// together (generate), the recipe's rewards of them (score_rewards), and
// the prompt + completion rows that its log-probs passes score.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tightfit/plugin_sdk.hpp"

namespace tf_rl {

// One prompt's ids (int64 [P]) of a batch of prompts: row r without its padding.
inline at::Tensor prompt_ids(const tf_sdk::Batch& prompts, int64_t r) {
  const at::Tensor mask = prompts.attention_mask();
  const int64_t len =
      mask.defined() ? mask[r].ne(0).sum().item<int64_t>() : prompts.tokens().size(1);
  return prompts.tokens()[r].narrow(0, 0, len).to(at::kCPU).contiguous();
}

struct Sampling {
  int64_t n = 8;  // completions of each prompt
  int64_t max_new_tokens = 256;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0.0;               // 0: off (ABI 1.26)
  double repetition_penalty = 1.0;  // 1: off (ABI 1.26)
  std::vector<int64_t> stop_ids;    // a completion ends with the first it samples (kept)
};

struct Sampled {
  at::Tensor ids;      // int64 [n, C]: each completion, then `pad`
  at::Tensor lengths;  // int64 [n]
  int64_t pad = 0;
  // The tokenizer's EOS and pad ids (-1: none): a completion ending in
  // neither was cut at max_new_tokens (TRL's is_truncated).
  int64_t eos = -1, pad_token = -1;
};

// Several prompts' completions as one: their rows one after another, the
// narrower ones' columns padded out with `pad` to the widest.
inline Sampled concat_rows(const std::vector<Sampled>& parts) {
  if (parts.empty()) throw std::invalid_argument("concat_rows: no completions to join");
  Sampled all;
  int64_t width = 1;
  for (const Sampled& one : parts) {
    width = std::max<int64_t>(width, one.ids.size(1));
    all.pad = one.pad, all.eos = one.eos, all.pad_token = one.pad_token;
  }
  std::vector<at::Tensor> ids, lengths;
  for (const Sampled& one : parts) {
    const at::Tensor& t = one.ids;
    ids.push_back(
        t.size(1) == width
            ? t
            : at::cat({t, at::full({t.size(0), width - t.size(1)}, all.pad, t.options())}, 1));
    lengths.push_back(one.lengths);
  }
  all.ids = at::cat(ids);
  all.lengths = at::cat(lengths);
  return all;
}

// Each of `prompts` (int64 [P_b]) completed s.n times with the policy as it
// is, prompt b's rows drawn from a generator seeded with seeds[b]: rows
// prompt 0's n, then prompt 1's, ... A 1.27 host decodes them all at once;
// an older one is asked for each prompt in turn.
inline Sampled generate(const tf_sdk::Host& host, const std::vector<at::Tensor>& prompts,
                        const Sampling& s, const std::vector<uint64_t>& seeds) {
  if (!TF_HAS(host.api(), tf_host_api, generate))
    throw std::runtime_error("this tightfit has no generate (plugin ABI 1.25): update it");
  if (prompts.empty() || seeds.size() != prompts.size())
    throw std::invalid_argument("generate: give at least one prompt, and a seed for each");
  const bool together = host.api()->abi_version >= TF_MAKE_VERSION(1, 27);
  if (!together && prompts.size() > 1) {
    std::vector<Sampled> each;
    for (size_t b = 0; b < prompts.size(); ++b)
      each.push_back(generate(host, {prompts[b]}, s, {seeds[b]}));
    return concat_rows(each);
  }
  tf_generate_request r{};
  r.struct_size = sizeof r;
  std::vector<at::Tensor> flat;
  std::vector<int64_t> lengths;
  for (const at::Tensor& p : prompts) {
    flat.push_back(p.to(at::kCPU, at::kLong).reshape({-1}));
    lengths.push_back(flat.back().numel());
  }
  const at::Tensor p = at::cat(flat).contiguous();
  const at::Tensor l = at::tensor(lengths, at::kLong);
  r.prompt = tf_sdk::lend(p);
  if (together) {
    r.n_prompts = static_cast<int32_t>(prompts.size());
    r.prompt_lengths = tf_sdk::lend(l);
    r.prompt_seeds = seeds.data();
  }
  r.n = static_cast<int32_t>(s.n);
  r.max_new_tokens = s.max_new_tokens;
  r.temperature = s.temperature;
  r.top_p = s.top_p;
  r.top_k = s.top_k;
  r.seed = seeds.front();
  if (s.min_p != 0 || s.repetition_penalty != 1.0) {
    // An older host would read no further than top_k and sample without them.
    if (host.api()->abi_version < TF_MAKE_VERSION(1, 26))
      throw std::runtime_error(
          "min_p and repetition_penalty need a tightfit with plugin ABI 1.26: update it, or "
          "leave them at 0 and 1");
    r.min_p = s.min_p;
    r.repetition_penalty = s.repetition_penalty;
  }
  r.stop_ids = s.stop_ids.data();
  r.n_stop_ids = static_cast<int32_t>(s.stop_ids.size());
  tf_generate_result out{};
  out.struct_size = sizeof out;
  host.check(host.api()->generate(host.ctx(), &r, &out));
  return {tf_sdk::take(out.completions), tf_sdk::take(out.lengths), out.pad, out.eos,
          out.pad_token};
}

// `prompt` (int64 [P]) completed s.n times with the policy as it is.
inline Sampled generate(const tf_sdk::Host& host, const at::Tensor& prompt, const Sampling& s,
                        uint64_t seed) {
  return generate(host, std::vector<at::Tensor>{prompt}, s, std::vector<uint64_t>{seed});
}

struct Rewards {
  at::Tensor scores;   // fp64 [n, R], NaN where a reward gave none
  at::Tensor weights;  // fp64 [R]
  std::vector<std::string> names;
};

// The recipe's rewards of completions of the prompt rows `row_ids` (int64 [n]).
inline Rewards score_rewards(const tf_sdk::Host& host, const at::Tensor& row_ids,
                             const at::Tensor& completions, const at::Tensor& lengths) {
  if (!TF_HAS(host.api(), tf_host_api, score_rewards))
    throw std::runtime_error("this tightfit has no score_rewards (plugin ABI 1.25): update it");
  const at::Tensor ids = row_ids.to(at::kLong).contiguous();
  const at::Tensor c = completions.to(at::kLong).contiguous();
  const at::Tensor l = lengths.to(at::kLong).contiguous();
  tf_reward_request r{};
  r.struct_size = sizeof r;
  r.row_ids = tf_sdk::lend(ids);
  r.completions = tf_sdk::lend(c);
  r.lengths = tf_sdk::lend(l);
  tf_reward_scores out{};
  out.struct_size = sizeof out;
  host.check(host.api()->score_rewards(host.ctx(), &r, &out));
  Rewards w{tf_sdk::take(out.scores), tf_sdk::take(out.weights), {}};
  for (int32_t i = 0; i < out.count; ++i) w.names.emplace_back(out.names[i]);
  return w;
}

// Prompt + completion rows as TRL's _compute_loss scores them: row i is its
// prompt's ids then its completion's (through its stop id), padded after
// with `pad`; targets are the completion's tokens where `mask` (int64
// [n, C], the completion mask) is 1, ignore_index elsewhere. `prompt_of[i]`
// is row i's prompt.
struct ScoredRows {
  at::Tensor tokens, targets, attention_mask;  // int64 [n, T]
  at::Tensor positions;  // int64 [n, C]: where completion token c of row i sits in targets
};
inline ScoredRows scored_rows(const std::vector<at::Tensor>& prompt_of, const at::Tensor& ids_in,
                              const at::Tensor& lengths_in, const at::Tensor& mask_in,
                              int64_t pad) {
  const at::Tensor ids = ids_in.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor lengths = lengths_in.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor mask = mask_in.to(at::kCPU, at::kLong).contiguous();
  const int64_t n = ids.size(0), C = ids.size(1);
  const auto len = lengths.accessor<int64_t, 1>();
  const auto id = ids.accessor<int64_t, 2>();
  const auto m = mask.accessor<int64_t, 2>();
  int64_t width = 1;
  for (int64_t i = 0; i < n; ++i)
    width = std::max<int64_t>(width, prompt_of[static_cast<size_t>(i)].size(0) + len[i] - 1);
  ScoredRows r;
  r.tokens = at::full({n, width}, pad, at::kLong);
  r.targets = at::full({n, width}, -100, at::kLong);
  r.attention_mask = at::zeros({n, width}, at::kLong);
  r.positions = at::zeros({n, C}, at::kLong);
  auto tok = r.tokens.accessor<int64_t, 2>();
  auto tgt = r.targets.accessor<int64_t, 2>();
  auto att = r.attention_mask.accessor<int64_t, 2>();
  auto pos = r.positions.accessor<int64_t, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor p = prompt_of[static_cast<size_t>(i)].to(at::kCPU, at::kLong).contiguous();
    const int64_t P = p.size(0), L = len[i];
    const int64_t* pp = p.data_ptr<int64_t>();
    // The last token is only ever a target: the inputs stop one before it.
    for (int64_t t = 0; t < P + L - 1; ++t) {
      tok[i][t] = t < P ? pp[t] : id[i][t - P];
      att[i][t] = 1;
    }
    for (int64_t c = 0; c < L; ++c) {
      pos[i][c] = P - 1 + c;
      if (m[i][c] != 0) tgt[i][P - 1 + c] = id[i][c];
    }
  }
  return r;
}

}  // namespace tf_rl
