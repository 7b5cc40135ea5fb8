// Host services for preference training: sequence and token log-probabilities
// (and the backward of a weighted sum of them), and the strategies' adapters off and on
// for a reference model without a second copy.
#include "host_api_services.hpp"
#include "plugin_hooks.hpp"
#include "strategy_chain.hpp"

namespace tightfit::host_services {

tf_status h_sequence_logps(tf_host_context* ctx, const tf_batch* in, tf_tensor grad_weights,
                           tf_tensor* out_logps, tf_tensor* out_counts) {
  return serve(ctx, [&] {
    const tf_batch b = read_struct(in);
    require(b.tokens, "tf_batch.tokens");
    require(b.targets, "tf_batch.targets");
    const Executor::SequenceLogps r = ctx->kernel->executor->sequence_logps(
        handle_tensor(b.tokens), handle_tensor(b.targets),
        b.positions ? handle_tensor(b.positions) : at::Tensor(),
        grad_weights ? handle_tensor(grad_weights) : at::Tensor());
    if (out_logps) *out_logps = give_handle(r.logps);
    if (out_counts) *out_counts = give_handle(r.counts);
  });
}

tf_status h_token_logps(tf_host_context* ctx, const tf_batch* in, tf_tensor grad_weights,
                        tf_tensor* out_logps) {
  return serve(ctx, [&] {
    const tf_batch b = read_struct(in);
    require(b.tokens, "tf_batch.tokens");
    require(b.targets, "tf_batch.targets");
    require(out_logps, "out_logps");
    const Executor::TokenLogps r = ctx->kernel->executor->token_logps(
        handle_tensor(b.tokens), handle_tensor(b.targets),
        b.positions ? handle_tensor(b.positions) : at::Tensor(),
        grad_weights ? handle_tensor(grad_weights) : at::Tensor());
    *out_logps = give_handle(r.logps);
  });
}

tf_status h_adapters_set_enabled(tf_host_context* ctx, int32_t enabled, int32_t* out_count) {
  return serve(ctx, [&] {
    int32_t holders = 0;
    StrategyChain(ctx->kernel->plugins->strategies)
        .each_with(
            TF_STRATEGY_HOOK(set_adapters_enabled),
            [&](size_t i, tf_status st) {
              if (st == TF_OK)
                ++holders;
              else if (st != TF_NOT_HANDLED)
                check_plugin_status(st, ctx->kernel->plugins->strategies[i],
                                    "set_adapters_enabled");
            },
            enabled != 0 ? 1 : 0);
    // A plan (dry run) has no executor; the strategies answered all the same.
    if (holders > 0 && ctx->kernel->executor)
      ctx->kernel->executor->set_adapters_enabled(enabled != 0);
    if (out_count) *out_count = holders;
  });
}

}  // namespace tightfit::host_services
