// Host services for preference training: sequence and token log-probabilities
// (and the backward of a weighted sum of them, the model's loss terms, each
// position's mean logit), and the strategies' adapters off and on for a
// reference model without a second copy.
#include <cmath>
#include <optional>

#include "host_api_services.hpp"
#include "plugin_hooks.hpp"
#include "strategy_chain.hpp"

namespace tightfit::host_services {
namespace {

// What a logps call hands the executor of its tf_batch beyond the tokens:
// the padding (ABI 1.16's attention_mask, where the caller's struct has
// it), and the loss terms take_loss_terms let it take, once.
struct LogpsRows {
  at::Tensor positions, attention_mask;
  bool padding_known = true;
  std::optional<Executor::LossTermsTaken> terms;
  tf_tensor* mean_logits = nullptr;  // take_mean_logits' *out
};

// What take_loss_terms and take_mean_logits asked is taken first, so that
// a call refused for its batch leaves nothing armed for a later one.
LogpsRows logps_rows(tf_host_context* ctx, const tf_batch* in, tf_batch& b) {
  LogpsRows r;
  if (ctx->kernel->executor) {
    r.terms = ctx->kernel->executor->disarm_loss_terms();
    r.mean_logits = ctx->kernel->executor->disarm_mean_logits();
  }
  b = read_struct(in);
  if (b.positions) r.positions = handle_tensor(b.positions);
  r.padding_known = covers_attention_mask(in);
  if (r.padding_known && b.attention_mask) r.attention_mask = handle_tensor(b.attention_mask);
  return r;
}

// Hands take_mean_logits' *out each position's mean logit, when the call
// was asked to measure them.
template <class R>
const R& handing_mean_logits(const LogpsRows& rows, const R& r) {
  if (rows.mean_logits) *rows.mean_logits = give_handle(r.mean_logits);
  return r;
}

}  // namespace

tf_status h_take_loss_terms(tf_host_context* ctx, double grad_weight, double* out_sum) {
  return serve(ctx, [&] {
    require(out_sum, "out_sum");
    if (!std::isfinite(grad_weight))
      throw std::invalid_argument("take_loss_terms: grad_weight must be finite");
    if (!ctx->kernel->executor)
      throw std::invalid_argument("take_loss_terms: no pass can run (a plan runs none)");
    ctx->kernel->executor->arm_loss_terms({grad_weight, out_sum});
  });
}

tf_status h_take_mean_logits(tf_host_context* ctx, tf_tensor* out) {
  return serve(ctx, [&] {
    require(out, "out");
    if (!ctx->kernel->executor)
      throw std::invalid_argument("take_mean_logits: no pass can run (a plan runs none)");
    ctx->kernel->executor->arm_mean_logits(out);
  });
}

tf_status h_sequence_logps(tf_host_context* ctx, const tf_batch* in, tf_tensor grad_weights,
                           tf_tensor* out_logps, tf_tensor* out_counts) {
  return serve(ctx, [&] {
    tf_batch b{};
    const LogpsRows rows = logps_rows(ctx, in, b);
    require(b.tokens, "tf_batch.tokens");
    require(b.targets, "tf_batch.targets");
    const Executor::SequenceLogps r = handing_mean_logits(
        rows,
        ctx->kernel->executor->sequence_logps(
            handle_tensor(b.tokens), handle_tensor(b.targets), rows.positions,
            grad_weights ? handle_tensor(grad_weights) : at::Tensor(), rows.attention_mask,
            rows.terms ? &*rows.terms : nullptr, rows.padding_known, rows.mean_logits != nullptr));
    if (out_logps) *out_logps = give_handle(r.logps);
    if (out_counts) *out_counts = give_handle(r.counts);
  });
}

tf_status h_token_logps(tf_host_context* ctx, const tf_batch* in, tf_tensor grad_weights,
                        tf_tensor* out_logps) {
  return serve(ctx, [&] {
    tf_batch b{};
    const LogpsRows rows = logps_rows(ctx, in, b);
    require(b.tokens, "tf_batch.tokens");
    require(b.targets, "tf_batch.targets");
    require(out_logps, "out_logps");
    const Executor::TokenLogps r = handing_mean_logits(
        rows,
        ctx->kernel->executor->token_logps(
            handle_tensor(b.tokens), handle_tensor(b.targets), rows.positions,
            grad_weights ? handle_tensor(grad_weights) : at::Tensor(), rows.attention_mask,
            rows.terms ? &*rows.terms : nullptr, rows.padding_known, rows.mean_logits != nullptr));
    *out_logps = give_handle(r.logps);
  });
}

tf_status h_adapters_set_enabled(tf_host_context* ctx, int32_t enabled, int32_t* out_count) {
  return serve(ctx, [&] {
    // A plan (dry run) has no executor; the strategies answer all the same.
    const int32_t holders = ctx->kernel->executor
                                ? ctx->kernel->executor->switch_adapters(enabled != 0)
                                : switch_strategy_adapters(*ctx->kernel->plugins, enabled != 0);
    if (out_count) *out_count = holders;
  });
}

}  // namespace tightfit::host_services
