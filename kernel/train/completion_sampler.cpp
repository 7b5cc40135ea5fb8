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
    return at::multinomial(at::softmax(logits / rule.temperature, 1), 1, false, generator)
        .squeeze(1);
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
  return idx.gather(1, at::multinomial(probs, 1, false, generator)).squeeze(1);
}

int64_t prefill_chunk_tokens(int64_t rows, int64_t vocab, int64_t logits_bytes) {
  return std::max<int64_t>(
      1, logits_bytes / (std::max<int64_t>(rows, 1) * std::max<int64_t>(vocab, 1) * 4));
}

namespace {

void check_request(const CompletionRequest& r) {
  if (r.prompt.empty()) throw std::invalid_argument("generate: the prompt has no token");
  if (r.n < 1) throw std::invalid_argument("generate: n must be >= 1");
  if (r.max_new_tokens < 1) throw std::invalid_argument("generate: max_new_tokens must be >= 1");
  if (!(r.rule.temperature >= 0 && std::isfinite(r.rule.temperature)))
    throw std::invalid_argument("generate: temperature must be a finite number >= 0");
  if (!(r.rule.top_p > 0 && r.rule.top_p <= 1))
    throw std::invalid_argument("generate: top_p must be in (0, 1]");
  if (r.rule.top_k < 0) throw std::invalid_argument("generate: top_k must be >= 0");
  if (!(r.rule.min_p >= 0 && r.rule.min_p <= 1))
    throw std::invalid_argument("generate: min_p must be in [0, 1] (0: off)");
  if (!(r.rule.repetition_penalty > 0 && std::isfinite(r.rule.repetition_penalty)))
    throw std::invalid_argument(
        "generate: repetition_penalty must be a finite number > 0 (1: off)");
}

// The model's decode over `x` [n, T] after what its cache holds: the last
// position's logits [n, V].
struct Decoder {
  Decoder(const KernelParts& k, int64_t logits_bytes)
      : kernel(k), model(k.plugins->model), prefill_logits_bytes(logits_bytes) {
    const tf_model_vtable* vt = model.plugin->model();
    incremental = vt->decode && vt->release_cache;
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
  at::Tensor next_logits(const at::Tensor& context, int64_t fresh) {
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
      check_plugin_status(call_hook(model, model.plugin->model(), TF_MODEL_HOOK(decode), &cache,
                                    borrow_handle(x), &out),
                          model, "decode");
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

}  // namespace

Completions sample_completions(const KernelParts& kernel, const CompletionRequest& r,
                               int64_t pad_id) {
  check_request(r);
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(r.seed);
  const at::Device device = kernel.env->device;
  const auto P = static_cast<int64_t>(r.prompt.size());
  at::Tensor context = at::tensor(r.prompt, at::kLong).unsqueeze(0).expand({r.n, P}).contiguous();
  context = context.to(device);
  at::Tensor ids = at::full({r.n, r.max_new_tokens}, pad_id, at::kLong);
  at::Tensor lengths = at::full({r.n}, r.max_new_tokens, at::kLong);
  std::vector<bool> done(static_cast<size_t>(r.n), false);
  int64_t open = r.n, steps = 0;
  Decoder decoder(kernel, r.prefill_logits_bytes);
  for (int64_t t = 0; t < r.max_new_tokens && open > 0; ++t) {
    const at::Tensor next =
        sample_next_tokens(decoder.next_logits(context, t == 0 ? P : 1), r.rule, generator,
                           r.rule.repetition_penalty != 1.0 ? context : at::Tensor());
    auto picked = next.accessor<int64_t, 1>();
    for (int64_t i = 0; i < r.n; ++i) {
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
  }
  Completions out;
  out.ids = ids.narrow(1, 0, std::max<int64_t>(steps, 1)).contiguous();
  out.lengths = lengths.clamp_max(steps);
  out.pad = pad_id;
  return out;
}

}  // namespace tightfit
