// run_pass (ABI 1.20): one pass as a value, tf_pass read into the kernel's
// PassRequest and Executor::run's outcome written to tf_pass_result. A
// deferred loss is written into the caller's result at the update's read;
// read_later does the same for a plugin's own value.
#include <cmath>
#include <cstddef>
#include <memory>

#include "host_api_services.hpp"

namespace tightfit::host_services {
namespace {

PassRequest::Compute compute_of(tf_pass_compute c) {
  switch (c) {
    case TF_PASS_LOSS:
      return PassRequest::Compute::kLoss;
    case TF_PASS_SEQUENCE_LOGPS:
      return PassRequest::Compute::kSequenceLogps;
    case TF_PASS_TOKEN_LOGPS:
      return PassRequest::Compute::kTokenLogps;
    default:
      throw std::invalid_argument("tf_pass.compute " + std::to_string(static_cast<int64_t>(c)) +
                                  " is none of TF_PASS_LOSS, TF_PASS_SEQUENCE_LOGPS, "
                                  "TF_PASS_TOKEN_LOGPS");
  }
}

// The caller's result of a deferred pass: written when the read comes,
// into the struct itself once run_pass has returned.
struct DeferredResult {
  tf_pass_result* out = nullptr;
  bool returned = false;
  bool read = false;
  double loss = 0;
};

}  // namespace

tf_status h_run_pass(tf_host_context* ctx, const tf_pass* in, tf_pass_result* out) {
  return serve(ctx, [&] {
    const tf_pass pass = read_struct(in);
    check_size(out, "tf_pass_result");
    require(pass.batch, "tf_pass.batch");
    if (!ctx->kernel->executor)
      throw std::invalid_argument("run_pass: no pass can run (a plan runs none)");
    const tf_batch b = read_struct(pass.batch);
    require(b.tokens, "tf_batch.tokens");
    require(b.targets, "tf_batch.targets");
    PassRequest r;
    r.compute = compute_of(pass.compute);
    const bool loss = r.compute == PassRequest::Compute::kLoss;
    if (loss) refuse_pairs_in_a_loss_pass(b);
    if (loss && pass.targets)
      throw std::invalid_argument(
          "tf_pass.targets is a log-probs pass's: a loss pass trains on the batch's targets");
    r.tokens = handle_tensor(b.tokens);
    r.targets = handle_tensor(pass.targets ? pass.targets : b.targets);
    r.rows = PassRows(b.positions ? handle_tensor(b.positions) : at::Tensor());
    // An older caller's tf_batch cannot say which tokens pad (ABI 1.16).
    r.rows.padding_known = covers_attention_mask(pass.batch);
    if (r.rows.padding_known && b.attention_mask)
      r.rows.attention_mask = handle_tensor(b.attention_mask);
    r.backward = pass.backward != 0;
    r.loss_scale = pass.loss_scale == 0 ? 1.0 : pass.loss_scale;
    if (!std::isfinite(r.loss_scale))
      throw std::invalid_argument("tf_pass.loss_scale must be finite");
    if (pass.grad_weights) r.grad_weights = handle_tensor(pass.grad_weights);
    r.adapters_off = pass.adapters_off != 0;
    r.param_copies = pass.param_copies ? pass.param_copies : "";
    if (!r.param_copies.empty() && !ctx->kernel->store->has_copies(r.param_copies))
      throw std::invalid_argument("tf_pass.param_copies: no copies were declared under \"" +
                                  r.param_copies +
                                  "\" (declare_param_copies in the schedule's "
                                  "create)");
    if (pass.take_loss_terms) {
      if (!std::isfinite(pass.loss_terms_grad_weight))
        throw std::invalid_argument("tf_pass.loss_terms_grad_weight must be finite");
      r.loss_terms_weight = pass.loss_terms_grad_weight;
    }
    r.mean_logits = pass.mean_logits != 0;
    r.temperature = pass.temperature == 0 ? 1.0 : pass.temperature;
    r.entropies = pass.entropies != 0;
    if (r.entropies && out->struct_size < offsetof(tf_pass_result, entropies) + sizeof(tf_tensor))
      throw std::invalid_argument(
          "tf_pass.entropies: the caller's tf_pass_result is older than ABI 1.25 and cannot "
          "carry them");
    if (!loss && out->struct_size < offsetof(tf_pass_result, read_pending) + sizeof(int32_t))
      throw std::invalid_argument(
          "run_pass: the caller's tf_pass_result is older than ABI 1.20 and cannot carry "
          "log-probs");
    std::shared_ptr<DeferredResult> deferred;
    if (pass.defer_read) {
      if (!loss) throw std::invalid_argument("tf_pass.defer_read is a loss pass's");
      if (out->struct_size < offsetof(tf_pass_result, read_pending) + sizeof(int32_t))
        throw std::invalid_argument(
            "tf_pass.defer_read: the caller's tf_pass_result is older than ABI 1.20 and has no "
            "read_pending to say when its loss is written");
      deferred = std::make_shared<DeferredResult>();
      deferred->out = out;
      r.deferred = [deferred](double value) {
        if (!deferred->returned) {
          deferred->read = true;
          deferred->loss = value;
          return;
        }
        deferred->out->loss = value;
        deferred->out->finite = std::isfinite(value) ? 1 : 0;
        deferred->out->read_pending = 0;
      };
    }
    const PassOutcome o = ctx->kernel->executor->run(r);
    tf_pass_result p{};
    p.loss = o.loss;
    p.finite = o.finite ? 1 : 0;
    p.n_tokens = o.n_tokens;
    if (deferred) {
      deferred->returned = true;
      if (deferred->read) {  // read before returning (outside a step)
        p.loss = deferred->loss;
        p.finite = std::isfinite(deferred->loss) ? 1 : 0;
      } else {
        p.read_pending = 1;
        p.finite = 1;
      }
    }
    p.loss_terms = o.loss_terms;
    if (o.logps.defined()) p.logps = give_handle(o.logps);
    if (o.counts.defined()) p.counts = give_handle(o.counts);
    if (o.mean_logits.defined()) p.mean_logits = give_handle(o.mean_logits);
    if (o.entropies.defined()) p.entropies = give_handle(o.entropies);
    write_struct(out, p);
  });
}

tf_status h_read_later(tf_host_context* ctx, tf_tensor value, double* out) {
  return serve(ctx, [&] {
    require(value, "value");
    require(out, "out");
    const at::Tensor& v = handle_tensor(value);
    if (v.numel() != 1 ||
        !(v.is_floating_point() || v.scalar_type() == at::kLong || v.scalar_type() == at::kInt))
      throw std::invalid_argument(
          "read_later: the value must be one real number, not a tensor "
          "of " +
          std::to_string(v.numel()) + " values");
    if (!ctx->kernel->executor)
      throw std::invalid_argument("read_later: no step runs (a plan runs none)");
    // The plugin's own slot outlives run_step: written when the step ends
    // at the latest.
    ctx->kernel->executor->pending_reads().add(
        v.detach(), [out](double read) { *out = read; }, /*outlives=*/true);
  });
}

}  // namespace tightfit::host_services

namespace tightfit::host_services {

tf_status h_tiled_over_tokens(tf_host_context* ctx, tf_tensor x, tf_tokenwise_fn fn, void* user,
                              int64_t tag, tf_tensor* out) {
  return serve(ctx, [&] {
    require(x, "x");
    require(out, "out");
    if (fn == nullptr) throw std::invalid_argument("tiled_over_tokens: fn is NULL");
    // The function runs again in backward as the model's own call.
    if (ctx->kernel->plugins == nullptr || ctx != ctx->kernel->plugins->model.ctx.get())
      throw WrongPhase("tiled_over_tokens is the model's service (its stage_forward and decode)");
    *out = give_handle(ctx->kernel->executor->tiled_over_tokens(handle_tensor(x), {fn, user, tag}));
  });
}

}  // namespace tightfit::host_services
