// tiled_over_tokens (ABI 1.29): a model's per-token function (its
// feed-forward) run over the batch's tokens a tile at a time, so that its
// intermediates ([tokens x intermediate_size], four of them in a gated MLP)
// are one tile wide in forward and in backward, as Arctic's and Unsloth's
// tiled MLP. Forward keeps only the input; backward runs each tile again
// with autograd and backpropagates that tile's rows of the output's
// gradient, the parameters' gradients adding up over the tiles (the same
// sums in another order: within rounding of the untiled run, not bit for
// bit). Without autograd the tiles run once, each written into the output.
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "autocast_as.hpp"
#include "executor.hpp"
#include "memory_accounting.hpp"
#include "plugin_set.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
namespace {

// What backward needs to run a tile again: the model's function and the
// pass it ran in (its rows, the stage's compute device), without the pass's
// loss terms (a per-token function makes none).
struct TokenwiseCall : torch::CustomClassHolder {
  Executor* executor = nullptr;
  TokenwiseFn fn;
  PassScope scope;
  int64_t tile = 0;
  // Autocast as the forward ran (a strategy turns it on for a stage's
  // forward and recompute; backward runs outside them): the tiles run again
  // in the same dtypes, as torch.utils.checkpoint restores it.
  at::DeviceType device = at::kCPU;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
};

// Over one loop of tiles, a frozen compact or away weight is fetched once
// (dequantized, read from a tier) and reused by every tile: a gated MLP's
// three at once, where the whole feed-forward has one at a time (the plan
// counts them). The tensors go when the loop ends.
class ReusedWeights {
 public:
  explicit ReusedWeights(Executor& executor) : executor_(executor) {
    executor_.reuse_fetched_weights(&weights_);
  }
  ~ReusedWeights() { executor_.reuse_fetched_weights(nullptr); }
  ReusedWeights(const ReusedWeights&) = delete;
  ReusedWeights& operator=(const ReusedWeights&) = delete;

 private:
  Executor& executor_;
  std::map<std::string, at::Tensor> weights_;
};

at::Tensor flat_tokens(const at::Tensor& x) {
  return x.reshape({-1, x.size(-1)});
}

// each(begin, n) for the rows [begin, begin + n) of `tokens`, `tile` at a time.
template <class Each>
void each_tile(int64_t tokens, int64_t tile, Each&& each) {
  for (int64_t begin = 0; begin < tokens; begin += tile)
    each(begin, std::min(tile, tokens - begin));
}

// fn over x's tokens a tile at a time, each tile's output written into
// the whole output as it comes, the weights fetched once for the loop.
at::Tensor each_tile_once(Executor& executor, const TokenwiseFn& fn, const at::Tensor& x,
                          int64_t tile) {
  const at::Tensor flat = flat_tokens(x);
  at::Tensor out;
  const ReusedWeights reused(executor);
  each_tile(flat.size(0), tile, [&](int64_t begin, int64_t n) {
    const at::Tensor y = executor.call_tokenwise(fn, flat.narrow(0, begin, n));
    if (!out.defined()) out = at::empty({flat.size(0), y.size(-1)}, y.options());
    out.narrow(0, begin, n).copy_(y);
  });
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(out.size(-1));
  return out.view(shape);
}

struct TiledTokens : public torch::autograd::Function<TiledTokens> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& anchor, c10::intrusive_ptr<TokenwiseCall> call) {
    (void)anchor;  // requires grad: the parameters fn reads get their gradient even when x has none
    ctx->save_for_backward({x});
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    return each_tile_once(*call->executor, call->fn, x, call->tile);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    auto call = ctx->saved_data["call"].toCapsule();
    auto* tokenwise = static_cast<TokenwiseCall*>(call.get());
    const at::Tensor flat = flat_tokens(x.detach());
    const at::Tensor g = flat_tokens(grads[0]);
    const bool input_grad = ctx->needs_input_grad(0);
    at::Tensor gx = input_grad ? at::empty_like(flat) : at::Tensor();
    at::AutoGradMode enable(true);
    const ReusedWeights reused(*tokenwise->executor);
    bool any = true;
    each_tile(flat.size(0), tokenwise->tile, [&](int64_t begin, int64_t n) {
      if (!any) return;
      at::Tensor xt = flat.narrow(0, begin, n).detach();
      if (input_grad) xt.requires_grad_(true);
      at::Tensor yt;
      {
        // The tile's activations; the gradients its backward makes count as
        // the pass's (the parameters' are retagged when dispatched).
        CategoryScope scope(TF_MEM_ACTIVATIONS);
        const AutocastAs as_in_forward(tokenwise->device, tokenwise->autocast,
                                       tokenwise->autocast_dtype);
        yt = tokenwise->executor->call_tokenwise(tokenwise->fn, xt, &tokenwise->scope);
      }
      if (!yt.requires_grad()) {  // nothing fn reads trains, and x needs no gradient
        any = false;
        return;
      }
      torch::autograd::backward({yt}, {g.narrow(0, begin, n)});
      if (input_grad) gx.narrow(0, begin, n).copy_(xt.grad());
    });
    if (input_grad && !any) gx.zero_();
    return {input_grad ? gx.view(x.sizes()) : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor Executor::call_tokenwise(const TokenwiseFn& fn, const at::Tensor& x, PassScope* scope) {
  std::optional<EnteredPass> entered;
  if (scope != nullptr) entered.emplace(*this, *scope);
  tf_tensor out = nullptr;
  const tf_tensor lent = borrow_handle(x);
  const PluginInstance& model = plugins_.model;
  check_plugin_status(
      plugin_call(model, "tiled_over_tokens's function",
                  [&] { return fn.fn(fn.user, model.ctx.get(), fn.tag, lent, &out); }),
      model, "tiled_over_tokens's function");
  if (out == nullptr)
    throw PluginCallError("model plugin \"" + model.plugin->name +
                          "\" returned no tensor from its tiled_over_tokens function");
  return adopt_handle(StrategyChain::returned(out, model, "tiled_over_tokens's function", lent));
}

at::Tensor Executor::tiled_over_tokens(const at::Tensor& x, const TokenwiseFn& fn) {
  if (x.dim() < 1) throw std::invalid_argument("tiled_over_tokens: x must be [..., C]");
  const int64_t tokens = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (mlp_tile_tokens_ <= 0 || tokens <= mlp_tile_tokens_) return call_tokenwise(fn, x);
  // No backward: each tile once, into the output.
  if (!at::GradMode::is_enabled()) return each_tile_once(*this, fn, x, mlp_tile_tokens_);
  auto call = c10::make_intrusive<TokenwiseCall>();
  call->executor = this;
  call->fn = fn;
  call->tile = mlp_tile_tokens_;
  call->device = x.device().type();
  call->autocast = at::autocast::is_autocast_enabled(call->device);
  call->autocast_dtype = at::autocast::get_autocast_dtype(call->device);
  call->scope = *pass_;
  call->scope.terms = nullptr;
  call->scope.recompute_terms = nullptr;
  call->scope.terms_refused_by = "a tiled feed-forward (tiled_over_tokens)";
  if (!recompute_anchor_.defined()) prepare_recompute();
  return TiledTokens::apply(x, recompute_anchor_, call);
}

}  // namespace tightfit
