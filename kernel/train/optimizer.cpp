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
    const double n =
        at::linalg_vector_norm(g.detach(), 2, c10::nullopt, false, at::kFloat).item<double>();
    sq += n * n;
  }
  return std::sqrt(sq);
}

Optimizer::Clip Optimizer::clip(const std::vector<Param*>& params, double held_norm_sq) {
  const double kept = grad_norm(params);
  Clip c;
  c.norm = std::sqrt(kept * kept + held_norm_sq);
  if (cfg_.grad_clip > 0 && std::isfinite(c.norm) && c.norm > cfg_.grad_clip) {
    c.scale = cfg_.grad_clip / (c.norm + 1e-6);
    for (Param* p : params)
      if (p->value.grad().defined()) p->value.mutable_grad().mul_(c.scale);
  }
  return c;
}

std::vector<std::string> Optimizer::slot_names() const {
  if (cfg_.name == "sgd")
    return cfg_.momentum > 0 ? std::vector<std::string>{"momentum_buffer"}
                             : std::vector<std::string>{};
  return {"exp_avg", "exp_avg_sq"};
}

void Optimizer::update(Param& p, const at::Tensor& grad, int64_t step) {
  std::vector<at::Tensor*> slots;
  for (const auto& slot : slot_names()) {
    at::Tensor& t = state_[p.name + "." + slot];
    if (!t.defined()) {
      CategoryScope scope(TF_MEM_OPTIMIZER);
      t = at::zeros(p.value.sizes(), p.value.options().dtype(at::kFloat));
    }
    slots.push_back(&t);
  }
  update_with_state(p.value, p.decays(), grad, slots, step);
}

void Optimizer::update_with_state(const at::Tensor& value, bool decays, const at::Tensor& grad_in,
                                  const std::vector<at::Tensor*>& slots, int64_t step) {
  if (step < 0) step = steps_;
  if (slots.size() != slot_names().size())
    throw std::invalid_argument("optimizer " + cfg_.name + " needs " +
                                std::to_string(slot_names().size()) + " state tensors, got " +
                                std::to_string(slots.size()));
  for (const at::Tensor* t : slots)
    if (!t->defined() || t->sizes() != value.sizes() || t->scalar_type() != at::kFloat)
      throw std::invalid_argument("optimizer state must be fp32 tensors shaped like the parameter");
  at::NoGradGuard no_grad;
  // Low-precision weights are updated in fp32 and rounded once at the end;
  // their optimizer state is fp32 (small steps are not lost to bf16 spacing).
  const bool low = value.scalar_type() != at::kFloat && value.scalar_type() != at::kDouble;
  at::Tensor param;
  {
    CategoryScope scope(TF_MEM_TRANSIENT);  // the fp32 working copy lives only for this update
    param = low ? value.detach().to(at::kFloat) : value.detach();
  }
  at::Tensor grad = grad_in.to(param.scalar_type());
  const bool decay = decays && cfg_.weight_decay > 0;
  if (cfg_.name == "sgd") {
    if (decay) grad = grad.add(param, cfg_.weight_decay);
    if (cfg_.momentum > 0) {
      // From a zero buffer the first step's buffer is the gradient, as in torch.optim.SGD.
      at::Tensor& buf = *slots[0];
      buf.mul_(cfg_.momentum).add_(grad);
      grad = buf;
    }
    param.add_(grad, -lr_);
  } else {
    at::Tensor& m = *slots[0];
    at::Tensor& v = *slots[1];
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
  if (low) value.detach().copy_(param);
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& [k, t] : state_) n += t.numel() * t.element_size();
  return n;
}

}  // namespace tightfit
