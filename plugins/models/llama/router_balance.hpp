// The routers' load-balancing loss (Fedus et al. 2021, Switch Transformer,
// eq. 4) over a pass, as transformers' load_balancing_loss_func computes it
// when a config sets output_router_logits. Over the pass's L expert layers
// and its N tokens (those its attention mask keeps), with each layer's
// router probabilities p_l [N, E] and top-k choices:
//   f[k, e] = 1/(L N) #{(l, n) : choice k of token n in layer l is e}
//   P[e]    = 1/(L N) sum_{l, n} p_l[n, e]
//   aux     = E sum_{k, e} f[k, e] P[e] = E/(L N)^2 sum_e c[e] sum_l S_l[e]
// with c[e] the choices of expert e (every layer, every k) and
// S_l = sum_n p_l[n]. The loss gains coef * aux (router_aux_loss_coef).
// f has no gradient, so layer l's part of the term, E/(L N)^2 c . S_l, is
// linear in its own probabilities, with weights known once every layer has
// routed: the last stage adds the whole term, and a checkpointed layer adds
// its part again in its recompute, where its gradient is made.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "tightfit/plugin_sdk.hpp"

namespace llama {

class RouterBalance {
 public:
  RouterBalance(double coef, int64_t n_experts) : coef_(coef), n_experts_(n_experts) {}

  // A pass begins (its first stage, not a recompute): nothing counted yet.
  void begin_pass();
  // A layer routed its tokens: `probs` fp32 [N, E], `chosen` [N, K], `mask`
  // [N] (1: the token counts; undefined: all do). In the pass's forward the
  // layer is counted; in its recompute it adds its part of the term.
  void record(const at::Tensor& probs, const at::Tensor& chosen, const at::Tensor& mask,
              bool recompute, const tf_sdk::Host& host);
  // The last stage: the whole term, its value with the gradient of the
  // layers that kept theirs (again in the last stage's own recompute).
  void end_pass(bool recompute, const tf_sdk::Host& host);

 private:
  double coef_;
  int64_t n_experts_;
  std::vector<at::Tensor> sums_;  // S_l, each layer's, with its graph when it kept one
  at::Tensor choices_;            // c, fp32 [E]
  at::Tensor tokens_;             // N, fp32 0-dim
  at::Tensor scale_;              // coef E / (L N)^2, once the pass's layers are in
};

}  // namespace llama
