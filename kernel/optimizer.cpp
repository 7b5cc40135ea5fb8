#include "optimizer.hpp"

#include <cmath>

#include "memory_accounting.hpp"

namespace tightfit {

double Optimizer::grad_norm(const std::vector<Param*>& params) {
  CategoryScope scope(TF_MEM_TRANSIENT);
  double sq = 0;
  for (const Param* p : params) {
    const at::Tensor& g = p->value.grad();
    if (!g.defined()) continue;
    const double n = at::linalg_vector_norm(g.detach(), 2, c10::nullopt, false, at::kFloat).item<double>();
    sq += n * n;
  }
  return std::sqrt(sq);
}

double Optimizer::clip(const std::vector<Param*>& params) {
  const double norm = grad_norm(params);
  if (cfg_.grad_clip > 0 && std::isfinite(norm) && norm > cfg_.grad_clip) {
    const double scale = cfg_.grad_clip / (norm + 1e-6);
    for (Param* p : params)
      if (p->value.grad().defined()) p->value.mutable_grad().mul_(scale);
  }
  return norm;
}

void Optimizer::update(Param& p, const at::Tensor& grad_in, int64_t step) {
  if (step < 0) step = steps_;
  at::NoGradGuard no_grad;
  // Low-precision weights are updated in fp32 and rounded once at the end;
  // their optimizer state is fp32 (small steps are not lost to bf16 spacing).
  const bool low = p.value.scalar_type() != at::kFloat && p.value.scalar_type() != at::kDouble;
  at::Tensor param;
  {
    CategoryScope scope(TF_MEM_TRANSIENT);  // the fp32 working copy lives only for this update
    param = low ? p.value.detach().to(at::kFloat) : p.value;
  }
  at::Tensor grad = grad_in.to(param.scalar_type());
  const bool decay = p.decays() && cfg_.weight_decay > 0;
  if (cfg_.name == "sgd") {
    if (decay) grad = grad.add(param, cfg_.weight_decay);
    if (cfg_.momentum > 0) {
      at::Tensor& buf = state_[p.name + ".momentum_buffer"];
      if (!buf.defined()) {
        CategoryScope scope(TF_MEM_OPTIMIZER);
        buf = grad.clone();
      } else {
        buf.mul_(cfg_.momentum).add_(grad);
      }
      grad = buf;
    }
    param.add_(grad, -lr_);
  } else {
    at::Tensor& m = state_[p.name + ".exp_avg"];
    at::Tensor& v = state_[p.name + ".exp_avg_sq"];
    if (!m.defined()) {
      CategoryScope scope(TF_MEM_OPTIMIZER);
      m = at::zeros_like(param, at::MemoryFormat::Contiguous);
      v = at::zeros_like(param, at::MemoryFormat::Contiguous);
    }
    // Decoupled weight decay (Loshchilov & Hutter): p <- p (1 - lr wd).
    if (decay) param.mul_(1.0 - lr_ * cfg_.weight_decay);
    m.mul_(cfg_.beta1).add_(grad, 1.0 - cfg_.beta1);
    v.mul_(cfg_.beta2).addcmul_(grad, grad, 1.0 - cfg_.beta2);
    const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(step));
    const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(step));
    CategoryScope scope(TF_MEM_TRANSIENT);
    at::Tensor denom = (v / bc2).sqrt_().add_(cfg_.eps);
    param.addcdiv_(m, denom, -lr_ / bc1);
  }
  if (low) p.value.detach().copy_(param);
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& [k, t] : state_) n += t.numel() * t.element_size();
  return n;
}

}  // namespace tightfit
