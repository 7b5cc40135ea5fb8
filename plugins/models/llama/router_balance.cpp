#include "router_balance.hpp"

namespace llama {

void RouterBalance::begin_pass() {
  sums_.clear();
  choices_ = tokens_ = scale_ = at::Tensor();
}

void RouterBalance::record(const at::Tensor& probs, const at::Tensor& chosen,
                           const at::Tensor& mask, bool recompute, const tf_sdk::Host& host) {
  const at::Tensor counts =
      mask.defined() ? mask.to(probs.device(), at::kFloat).unsqueeze(1) : at::Tensor();
  const at::Tensor sum = (counts.defined() ? probs * counts : probs).sum(0);  // S_l [E]
  if (recompute) {
    // The pass's forward ran this layer without autograd: its part of the
    // term gets its gradient here (its value was counted in end_pass).
    if (scale_.defined())
      host.add_loss_term(scale_.to(sum.device()) * (choices_.to(sum.device()) * sum).sum());
    return;
  }
  const at::Tensor slots = chosen.reshape(-1);
  const at::Tensor slot_counts = counts.defined() ? counts.expand(chosen.sizes()).reshape(-1)
                                                  : at::ones_like(slots, at::kFloat);
  const at::Tensor c =
      at::zeros({n_experts_}, slot_counts.options()).index_add(0, slots, slot_counts);
  const at::Tensor n =
      counts.defined() ? counts.sum() : at::scalar_tensor(probs.size(0), c.options());
  const at::Device first = sums_.empty() ? probs.device() : choices_.device();
  choices_ = sums_.empty() ? c.to(first) : choices_ + c.to(first);
  if (sums_.empty()) tokens_ = n.to(first);  // every layer routes the same tokens
  sums_.push_back(sum);
}

void RouterBalance::end_pass(bool recompute, const tf_sdk::Host& host) {
  if (sums_.empty()) return;  // no expert layer ran (a pass of other stages)
  const at::Device device = choices_.device();
  if (!recompute) {
    // coef E / (L N)^2; a pass whose every token pads (N = 0) has c = S = 0
    // and adds 0.
    const double layers = static_cast<double>(sums_.size());
    scale_ = coef_ * static_cast<double>(n_experts_) / (tokens_.clamp_min(1.0) * layers).pow(2);
  }
  at::Tensor all = sums_.front().to(device);
  for (size_t l = 1; l < sums_.size(); ++l) all = all + sums_[l].to(device);
  host.add_loss_term(scale_ * (choices_ * all).sum());
}

}  // namespace llama
