// Executor::run: one pass as a value (pass_request.hpp). The weights it
// names (adapters off, the frozen copies) hold for it alone: what the
// modal services set (adapters_set_enabled, use_param_copies) is back when
// it returns, whether it returned or threw.
#include <cmath>
#include <stdexcept>

#include "executor.hpp"
#include "logging.hpp"
#include "plugin_hooks.hpp"
#include "strategy_chain.hpp"

namespace tightfit {

int32_t switch_strategy_adapters(PluginSet& plugins, bool on) {
  int32_t holders = 0;
  StrategyChain(plugins.strategies)
      .each_with(
          TF_STRATEGY_HOOK(set_adapters_enabled),
          [&](size_t i, tf_status st) {
            if (st == TF_OK)
              ++holders;
            else if (st != TF_NOT_HANDLED)
              check_plugin_status(st, plugins.strategies[i], "set_adapters_enabled");
          },
          on ? 1 : 0);
  return holders;
}

int32_t Executor::switch_adapters(bool on) {
  const int32_t holders = switch_strategy_adapters(plugins_, on);
  if (holders > 0) adapters_enabled_ = on;
  return holders;
}

namespace {

// The pass's weights for its scope: the adapters and the copies it asked
// for, and those that were there before once it ends.
class PassWeights {
 public:
  PassWeights(Executor& executor, const PassRequest& request)
      : executor_(executor),
        adapters_were_(executor.adapters_enabled()),
        copies_were_(executor.param_copies()) {
    // No strategy holding adapters: the model is the base model either way.
    if (adapters_were_ == request.adapters_off)
      switched_ = executor_.switch_adapters(!request.adapters_off) > 0;
    if (request.param_copies != copies_were_) executor_.use_param_copies(request.param_copies);
  }
  ~PassWeights() {
    try {
      if (executor_.param_copies() != copies_were_) executor_.use_param_copies(copies_were_);
      if (switched_) executor_.switch_adapters(adapters_were_);
    } catch (const std::exception& e) {  // a strategy refusing on the way out
      log_message(TF_LOG_ERROR,
                  std::string("after a pass, the adapters could not be set back: ") + e.what());
    }
  }
  PassWeights(const PassWeights&) = delete;
  PassWeights& operator=(const PassWeights&) = delete;

 private:
  Executor& executor_;
  const bool adapters_were_;
  const std::string copies_were_;
  bool switched_ = false;
};

}  // namespace

PassOutcome Executor::run(const PassRequest& request) {
  using Compute = PassRequest::Compute;
  if (request.deferred && request.compute != Compute::kLoss)
    throw std::invalid_argument("a pass's read can be deferred only for its loss, not log-probs");
  if (request.compute == Compute::kLoss &&
      (request.grad_weights.defined() || request.mean_logits || request.loss_terms_weight))
    throw std::invalid_argument(
        "a loss pass takes no grad_weights, mean logits or loss terms (those are a log-probs "
        "pass's; its loss has the model's terms in it already)");
  if (request.compute != Compute::kTokenLogps && (request.temperature != 1.0 || request.entropies))
    throw std::invalid_argument(
        "a temperature or entropies are a token log-probs pass's (TF_PASS_TOKEN_LOGPS)");
  if (!(request.temperature > 0 && std::isfinite(request.temperature)))
    throw std::invalid_argument("a pass's temperature must be finite and positive");
  const PassWeights weights(*this, request);
  PassOutcome out;
  if (request.compute == Compute::kLoss) {
    const PassResult r = run_pass(request.tokens, request.targets, request.backward,
                                  request.loss_scale, request.rows, request.deferred);
    out.loss = r.loss;
    out.finite = r.finite;
    out.n_tokens = r.n_tokens;
    return out;
  }
  if (request.backward != request.grad_weights.defined())
    throw std::invalid_argument(request.backward
                                    ? "a log-probs pass with backward needs its grad_weights"
                                    : "grad_weights given to a log-probs pass without backward");
  std::optional<LossTermsTaken> terms;
  if (request.loss_terms_weight)
    terms = LossTermsTaken{*request.loss_terms_weight, &out.loss_terms};
  const LossTermsTaken* taken = terms ? &*terms : nullptr;
  if (request.compute == Compute::kSequenceLogps) {
    const SequenceLogps r = sequence_logps(request.tokens, request.targets, request.rows.positions,
                                           request.grad_weights, request.rows.attention_mask, taken,
                                           request.rows.padding_known, request.mean_logits);
    out.logps = r.logps;
    out.counts = r.counts;
    out.finite = r.finite;
    out.mean_logits = r.mean_logits;
  } else {
    const TokenLogps r =
        token_logps(request.tokens, request.targets, request.rows.positions, request.grad_weights,
                    request.rows.attention_mask, taken, request.rows.padding_known,
                    request.mean_logits, {request.temperature, request.entropies});
    out.logps = r.logps;
    out.finite = r.finite;
    out.mean_logits = r.mean_logits;
    out.entropies = r.entropies;
  }
  out.n_tokens = request.tokens.numel();
  return out;
}

}  // namespace tightfit
