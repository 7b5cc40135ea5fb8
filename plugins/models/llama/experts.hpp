// Mixture-of-experts routing (Shazeer et al. 2017; Mixtral, Qwen-MoE, OLMoE)
// as transformers computes it: every token scores every expert, the top k
// run, and their outputs are summed weighted by the router's probabilities.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace llama {

// Each token's chosen experts and their weights.
struct Routing {
  at::Tensor weights;  // [N, K], the activations' dtype
  at::Tensor chosen;   // [N, K] expert ids (long)
  at::Tensor probs;    // [N, E] fp32, the router's softmax (the load-balancing loss reads it)
};

// p = softmax(router_logits) in fp32; the top_k of p, renormalized to sum 1
// when `renormalize` (Mixtral always; norm_topk_prob), then cast to `dtype`.
Routing route(const at::Tensor& router_logits, int64_t top_k, bool renormalize,
              at::ScalarType dtype);

// y[n] = sum_k weights[n, k] * expert(chosen[n, k], x[n]) for x [N, C]. Each
// expert runs once, on the tokens routed to it; an expert no token chose is
// not run at all (its weights get no gradient, as in transformers).
// `routed`, when given, hears which experts will run, in the order they
// run, before the first one does (for read-ahead of their weights).
using ExpertFn = std::function<at::Tensor(int64_t expert, const at::Tensor& x)>;
using RoutedFn = std::function<void(const std::vector<int64_t>& experts)>;
at::Tensor mix_experts(const at::Tensor& x, const Routing& r, int64_t n_experts,
                       const ExpertFn& expert, const RoutedFn& routed = {});

}  // namespace llama
