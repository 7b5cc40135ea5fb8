#include "experts.hpp"

#include <vector>

namespace llama {

Routing route(const at::Tensor& router_logits, int64_t top_k, bool renormalize,
              at::ScalarType dtype) {
  const at::Tensor p = at::softmax(router_logits, -1, at::kFloat);
  auto [weights, chosen] = at::topk(p, top_k, -1);
  if (renormalize) weights = weights / weights.sum(-1, true);
  return {weights.to(dtype), chosen, p};
}

at::Tensor mix_experts(const at::Tensor& x, const Routing& r, int64_t n_experts,
                       const ExpertFn& expert, const RoutedFn& routed) {
  const int64_t K = r.chosen.size(1);
  // Slot n K + k is token n's k-th choice; sorted by expert, each expert's
  // slots are one run of `order`. One host sync for the counts per block.
  const at::Tensor slots = r.chosen.reshape(-1);
  const at::Tensor order = at::argsort(slots, /*stable=*/true);
  const at::Tensor counts = at::bincount(slots, {}, n_experts).to(at::kCPU).contiguous();
  const int64_t* count = counts.data_ptr<int64_t>();
  const at::Tensor weight_of_slot = r.weights.reshape(-1);
  if (routed) {
    std::vector<int64_t> running;
    for (int64_t e = 0; e < n_experts; ++e)
      if (count[e] > 0) running.push_back(e);
    routed(running);
  }
  std::vector<at::Tensor> rows, outputs;
  int64_t start = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t n = count[e];
    if (n == 0) continue;
    const at::Tensor mine = order.narrow(0, start, n);
    const at::Tensor tokens = at::div(mine, K, "floor");
    outputs.push_back(expert(e, x.index_select(0, tokens)) *
                      weight_of_slot.index_select(0, mine).unsqueeze(-1));
    rows.push_back(tokens);
    start += n;
  }
  if (rows.empty()) return at::zeros_like(x);  // no tokens (N = 0): nothing routed
  return at::zeros_like(x).index_add(0, at::cat(rows), at::cat(outputs).to(x.scalar_type()));
}

}  // namespace llama
