#include "generation.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "completion_sampler.hpp"
#include "input_files.hpp"
#include "json_input.hpp"
#include "progress.hpp"
#include "session.hpp"

namespace tightfit {

const char* sampling_problem(const SamplingOptions& o) {
  // NaN passes no comparison: each bound is written to refuse it.
  if (!(o.n_tokens >= 0)) return "tokens must be >= 0";
  if (!(o.top_k >= 0)) return "top-k must be >= 0 (0 = every token, 1 = greedy)";
  if (!(o.temperature >= 0 && std::isfinite(o.temperature)))
    return "temperature must be a finite number >= 0 (0 = greedy)";
  if (!(o.top_p >= 0 && o.top_p <= 1))
    return "top-p must be in [0, 1] (1 = off, 0 = the likeliest token)";
  if (!(o.min_p >= 0 && o.min_p <= 1)) return "min-p must be in [0, 1] (0 = off)";
  if (!(o.repetition_penalty > 0 && std::isfinite(o.repetition_penalty)))
    return "repetition-penalty must be a finite number > 0 (1 = off; above 1 repeats less)";
  return nullptr;
}

namespace {

// The positions the model has, from its config.json (LLaMA-style
// max_position_embeddings, GPT-2's n_positions); 0 = no limit (RWKV).
std::pair<const char*, int64_t> position_limit(Session& s) {
  const std::string text = s.model_config_json();
  if (text.empty()) return {"", 0};
  const nlohmann::json config = parse_json(text, "the model's config.json");
  for (const char* key : {"max_position_embeddings", "n_positions"})
    if (config.contains(key) && config[key].is_number_integer())
      return {key, config[key].get<int64_t>()};
  return {"", 0};
}

}  // namespace

std::string generate_text(Session& s, const std::string& prompt, const SamplingOptions& o) {
  const int64_t n_tokens = o.n_tokens;
  const std::vector<int64_t>& stop_ids = o.stop_ids;
  auto stops = [&](int64_t id) {
    return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
  };
  if (const char* bad = sampling_problem(o)) throw std::invalid_argument(bad);
  // As tokenizer(prompt) in transformers: with the post-processor's BOS/EOS,
  // unless the prompt is a rendered chat template (which writes its own).
  std::vector<int64_t> ids = o.add_special_tokens
                                 ? s.data().tokenizer().encode_with_special_tokens(prompt)
                                 : s.data().tokenizer().encode(prompt);
  if (ids.empty())
    throw std::invalid_argument(
        "the prompt is empty and the tokenizer adds no beginning-of-sequence token: give a "
        "prompt of at least one token");
  const size_t prompt_len = ids.size();
  // Refused before the first token, not when decode reaches the end: the
  // count is the user's to change (transformers' GPT-2 fails there too).
  const auto [limit_key, limit] = position_limit(s);
  if (limit > 0 && static_cast<int64_t>(prompt_len) + n_tokens > limit)
    throw InputError(
        "the prompt's " + std::to_string(prompt_len) + " tokens and " + std::to_string(n_tokens) +
        " new ones need " + std::to_string(static_cast<int64_t>(prompt_len) + n_tokens) +
        " positions; the model has " + std::to_string(limit) + " (" + limit_key +
        "). Ask for at most " +
        std::to_string(std::max<int64_t>(0, limit - static_cast<int64_t>(prompt_len))) +
        " new tokens (generate -n, or [run] sample_tokens), or a shorter prompt");
  if (n_tokens == 0) return "";
  CompletionRequest r;
  r.prompts = {ids};
  r.seeds = {o.seed};
  r.max_new_tokens = n_tokens;
  r.rule = {o.temperature, o.top_k, o.top_p, o.min_p, o.repetition_penalty};
  r.stop_ids = stop_ids;
  r.use_cache = o.use_cache;
  Progress progress("generating", n_tokens, "tokens");
  r.on_token = [&](int64_t tokens) { progress.set(tokens); };
  const Completions done = sample_completions(s.parts(), r, /*pad_id=*/0);
  const int64_t length = done.lengths[0].item<int64_t>();
  for (int64_t t = 0; t < length; ++t) ids.push_back(done.ids[0][t].item<int64_t>());
  if (ids.size() > prompt_len && stops(ids.back())) ids.pop_back();
  return s.data().tokenizer().decode(
      std::vector<int64_t>(ids.begin() + static_cast<std::ptrdiff_t>(prompt_len), ids.end()));
}

// The session's own door to generation (session.hpp declares it).
std::string Session::generate(const std::string& prompt, int64_t n_tokens, int64_t top_k,
                              double temperature, uint64_t seed, double top_p, bool use_cache,
                              const std::vector<int64_t>& stop_ids) {
  return generate_text(
      *this, prompt,
      SamplingOptions{n_tokens, top_k, temperature, top_p, seed, use_cache, stop_ids});
}

std::string Session::generate(const std::string& prompt, const SamplingOptions& options) {
  return generate_text(*this, prompt, options);
}

}  // namespace tightfit
