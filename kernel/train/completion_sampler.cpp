#include "completion_sampler.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "executor.hpp"
#include "kernel_parts.hpp"
#include "logging.hpp"
#include "memory_accounting.hpp"
#include "plugin_hooks.hpp"
#include "plugin_set.hpp"
#include "run_environment.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {

namespace {

// One index of each row of `probs` ([R, N], non-negative, each row's sum
// > 0), drawn in proportion: the first whose running sum passes a uniform
// draw scaled to the row's total. One random number a row (multinomial
// draws an exponential for every entry: 49,152 logarithms a row a token).
at::Tensor draw_rows(const at::Tensor& probs, at::Generator& generator) {
  const at::Tensor cdf = probs.to(at::kDouble).cumsum(1);
  const at::Tensor total = cdf.narrow(1, cdf.size(1) - 1, 1);
  const at::Tensor u = at::rand({probs.size(0), 1}, generator, at::kDouble) * total;
  // right: the first running sum strictly above u, so a zero entry (its
  // running sum equal to the one before) is never chosen.
  return at::searchsorted(cdf, u, /*out_int32=*/false, /*right=*/true)
      .clamp_max(probs.size(1) - 1)
      .squeeze(1);
}

}  // namespace

at::Tensor sample_next_tokens(const at::Tensor& logits_in, const SamplingRule& rule,
                              at::Generator& generator, const at::Tensor& context) {
  at::Tensor logits = logits_in.to(at::kCPU, at::kFloat);
  if (rule.repetition_penalty != 1.0 && context.defined()) {
    // RepetitionPenaltyLogitsProcessor: each id seen, its logit divided by
    // the penalty where positive, multiplied where negative.
    const at::Tensor seen = context.to(at::kCPU, at::kLong);
    const at::Tensor z = logits.gather(1, seen);
    logits = logits.scatter(
        1, seen, at::where(z < 0, z * rule.repetition_penalty, z / rule.repetition_penalty));
  }
  if (rule.top_k == 1 || rule.temperature <= 0) return logits.argmax(1);
  const int64_t vocab = logits.size(1);
  // No warper cuts: every token keeps its probability, and no sort of the
  // vocabulary is needed (a full-vocabulary topk was 7% of a GRPO step).
  if (rule.top_k <= 0 && rule.top_p >= 1.0 && rule.min_p <= 0)
    return draw_rows(at::softmax(logits / rule.temperature, 1), generator);
  auto [vals, idx] = (logits / rule.temperature)
                         .topk(rule.top_k > 0 ? std::min<int64_t>(rule.top_k, vocab) : vocab, 1);
  at::Tensor probs = at::softmax(vals, 1);
  if (rule.top_p < 1.0) {  // keep the smallest prefix whose mass reaches top_p, at least one
    at::Tensor past = probs.cumsum(1) - probs >= rule.top_p;
    past.select(1, 0).fill_(false);  // transformers' min_tokens_to_keep = 1: top_p = 0 is greedy
    probs = probs.masked_fill(past, 0.0);
    probs = probs / probs.sum(1, true);
  }
  if (rule.min_p > 0) {  // MinPLogitsWarper: below min_p x the likeliest (the first), at least one
    const at::Tensor under = probs < probs.narrow(1, 0, 1) * rule.min_p;
    probs = probs.masked_fill(under, 0.0);
    probs = probs / probs.sum(1, true);
  }
  return idx.gather(1, draw_rows(probs, generator).unsqueeze(1)).squeeze(1);
}

int64_t prefill_chunk_tokens(int64_t rows, int64_t vocab, int64_t logits_bytes) {
  return std::max<int64_t>(
      1, logits_bytes / (std::max<int64_t>(rows, 1) * std::max<int64_t>(vocab, 1) * 4));
}

namespace {

void check_request(const CompletionRequest& r) {
  if (r.prompts.empty()) throw std::invalid_argument("generate: no prompt was given");
  if (r.seeds.size() != r.prompts.size())
    throw std::invalid_argument("generate: give one seed for each prompt");
  for (const auto& prompt : r.prompts)
    if (prompt.empty()) throw std::invalid_argument("generate: a prompt has no token");
  if (r.n < 1) throw std::invalid_argument("generate: n must be >= 1");
  if (r.max_new_tokens < 1) throw std::invalid_argument("generate: max_new_tokens must be >= 1");
  if (!(r.rule.temperature >= 0 && std::isfinite(r.rule.temperature)))
    throw std::invalid_argument("generate: temperature must be a finite number >= 0");
  if (!(r.rule.top_p >= 0 && r.rule.top_p <= 1))
    throw std::invalid_argument("generate: top_p must be in [0, 1] (0: the likeliest token)");
  if (r.rule.top_k < 0) throw std::invalid_argument("generate: top_k must be >= 0");
  if (!(r.rule.min_p >= 0 && r.rule.min_p <= 1))
    throw std::invalid_argument("generate: min_p must be in [0, 1] (0: off)");
  if (!(r.rule.repetition_penalty > 0 && std::isfinite(r.rule.repetition_penalty)))
    throw std::invalid_argument(
        "generate: repetition_penalty must be a finite number > 0 (1: off)");
}

// The model's decode over `x` [n, T] after what its cache holds: the last
// position's logits [n, V]. With `starts` (int64 [n]: each row's first real
// column, left-padded prompts), the model's decode_rows.
struct Decoder {
  Decoder(const KernelParts& k, const CompletionRequest& r)
      : kernel(k), model(k.plugins->model), prefill_logits_bytes(r.prefill_logits_bytes) {
    const tf_model_vtable* vt = model.plugin->model();
    incremental = r.use_cache && vt->decode && vt->release_cache;
  }
  ~Decoder() {
    if (!cache) return;
    try {
      plugin_call(model, "release_cache",
                  [&] { model.plugin->model()->release_cache(model.state, cache); });
    } catch (const std::exception& e) {
      log_message(TF_LOG_WARN, e.what());
    }
  }
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // `context` [n, T]: every id so far; `fresh`: how many of its last are new.
  at::Tensor next_logits(const at::Tensor& context, int64_t fresh, const at::Tensor& starts) {
    if (!incremental)  // the whole context again, as generate_text does without a cache
      return kernel.executor->forward_logits(context, /*training=*/false).select(1, -1);
    // A long prompt in pieces, so its logits never exist at once (only the
    // last position's are wanted).
    const int64_t piece = prefill_chunk_tokens(context.size(0), kernel.env->run_info.vocab_size,
                                               prefill_logits_bytes);
    at::Tensor last;
    for (int64_t from = context.size(1) - fresh; from < context.size(1); from += piece) {
      const at::Tensor x = context.narrow(1, from, std::min(piece, context.size(1) - from));
      tf_tensor out = nullptr;
      const tf_status status =
          starts.defined() ? call_hook(model, model.plugin->model(), TF_MODEL_HOOK(decode_rows),
                                       &cache, borrow_handle(x), borrow_handle(starts), &out)
                           : call_hook(model, model.plugin->model(), TF_MODEL_HOOK(decode), &cache,
                                       borrow_handle(x), &out);
      check_plugin_status(status, model, starts.defined() ? "decode_rows" : "decode");
      last = adopt_handle(StrategyChain::returned(out, model, "decode")).select(1, -1);
    }
    return last;
  }

  const KernelParts& kernel;
  const PluginInstance& model;
  int64_t prefill_logits_bytes;
  bool incremental = false;
  void* cache = nullptr;
};

// Whether the model decodes rows that begin at different columns (a plugin
// built before 1.27 has a zero reserved slot there, never read).
bool decodes_padded_rows(const PluginInstance& model) {
  const tf_model_vtable* vt = model.plugin->model();
  return TF_VERSION_MINOR(model.plugin->abi_version) >= 27 && vt->decode && vt->release_cache &&
         vt->decode_rows;
}

// Every prompt's n rows through one decode: `prompts` left-padded to the
// longest (the padding columns hold the row's first id, so the repetition
// penalty sees no id the row lacks), each prompt's rows drawn with its own
// generator.
Completions sample_together(const KernelParts& kernel, const CompletionRequest& r, int64_t pad_id) {
  const auto B = static_cast<int64_t>(r.prompts.size());
  const int64_t R = B * r.n;
  int64_t P = 0;
  for (const auto& prompt : r.prompts)
    P = std::max<int64_t>(P, static_cast<int64_t>(prompt.size()));
  at::Tensor context = at::empty({R, P}, at::kLong);
  at::Tensor starts = at::empty({R}, at::kLong);
  bool padded = false;
  std::vector<at::Generator> generators;
  for (int64_t b = 0; b < B; ++b) {
    const auto& prompt = r.prompts[static_cast<size_t>(b)];
    const auto len = static_cast<int64_t>(prompt.size());
    at::Tensor row = at::full({P}, prompt.front(), at::kLong);
    row.narrow(0, P - len, len).copy_(at::tensor(prompt, at::kLong));
    context.narrow(0, b * r.n, r.n).copy_(row.unsqueeze(0).expand({r.n, P}));
    starts.narrow(0, b * r.n, r.n).fill_(P - len);
    padded = padded || len < P;
    generators.push_back(at::make_generator<at::CPUGeneratorImpl>(r.seeds[static_cast<size_t>(b)]));
  }
  const at::Device device = kernel.env->device;
  context = context.to(device);
  at::Tensor ids = at::full({R, r.max_new_tokens}, pad_id, at::kLong);
  at::Tensor lengths = at::full({R}, r.max_new_tokens, at::kLong);
  std::vector<bool> done(static_cast<size_t>(R), false);
  int64_t open = R, steps = 0;
  Decoder decoder(kernel, r);
  if (padded) starts = starts.to(device);
  // Each prompt prefilled once, its cache then fanned out to its n rows
  // (TF_MODEL_FEATURE_DECODE_FANOUT), where the model can.
  const LoadedPlugin& model = *kernel.plugins->model.plugin;
  const bool fan_out = r.n > 1 && decoder.incremental &&
                       TF_VERSION_MINOR(model.abi_version) >= 27 &&
                       (model.model_features & TF_MODEL_FEATURE_DECODE_FANOUT) != 0;
  const bool penalised = r.rule.repetition_penalty != 1.0;
  at::Tensor logits;
  if (fan_out) {
    const at::Tensor first_rows = at::arange(0, R, r.n, at::kLong).to(device);
    logits = decoder
                 .next_logits(context.index_select(0, first_rows), P,
                              padded ? starts.index_select(0, first_rows) : at::Tensor())
                 .repeat_interleave(r.n, 0);
  }
  for (int64_t t = 0; t < r.max_new_tokens && open > 0; ++t) {
    if (t > 0 || !fan_out)
      logits = decoder.next_logits(context, t == 0 ? P : 1, padded ? starts : at::Tensor());
    std::vector<at::Tensor> drawn;
    for (int64_t b = 0; b < B; ++b)
      drawn.push_back(sample_next_tokens(
          logits.narrow(0, b * r.n, r.n), r.rule, generators[static_cast<size_t>(b)],
          penalised ? context.narrow(0, b * r.n, r.n) : at::Tensor()));
    const at::Tensor next = B == 1 ? drawn.front() : at::cat(drawn);
    auto picked = next.accessor<int64_t, 1>();
    for (int64_t i = 0; i < R; ++i) {
      if (done[static_cast<size_t>(i)]) continue;  // a finished row's draws are dropped
      ids[i][t] = picked[i];
      if (std::find(r.stop_ids.begin(), r.stop_ids.end(), picked[i]) != r.stop_ids.end()) {
        done[static_cast<size_t>(i)] = true;
        lengths[i] = t + 1;
        --open;
      }
    }
    context = at::cat({context, next.to(device).unsqueeze(1)}, 1);
    steps = t + 1;
    if (r.on_token) r.on_token(steps);
  }
  Completions out;
  out.ids = ids.narrow(1, 0, std::max<int64_t>(steps, 1)).contiguous();
  out.lengths = lengths.clamp_max(steps);
  out.pad = pad_id;
  return out;
}

}  // namespace

Completions sample_completions(const KernelParts& kernel, const CompletionRequest& r,
                               int64_t pad_id) {
  check_request(r);
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  const bool same_length = std::all_of(r.prompts.begin(), r.prompts.end(), [&](const auto& p) {
    return p.size() == r.prompts.front().size();
  });
  if (same_length || (r.use_cache && decodes_padded_rows(kernel.plugins->model)))
    return sample_together(kernel, r, pad_id);
  // Prompts of different lengths, and a model that cannot pad them: one at
  // a time, their completions padded to the longest.
  std::vector<at::Tensor> ids, lengths;
  int64_t width = 1;
  for (size_t b = 0; b < r.prompts.size(); ++b) {
    CompletionRequest one = r;
    one.prompts = {r.prompts[b]};
    one.seeds = {r.seeds[b]};
    Completions c = sample_together(kernel, one, pad_id);
    width = std::max<int64_t>(width, c.ids.size(1));
    ids.push_back(std::move(c.ids));
    lengths.push_back(std::move(c.lengths));
  }
  for (at::Tensor& t : ids)
    if (t.size(1) < width)
      t = at::cat({t, at::full({t.size(0), width - t.size(1)}, pad_id, at::kLong)}, 1);
  return {at::cat(ids), at::cat(lengths), pad_id};
}

}  // namespace tightfit
