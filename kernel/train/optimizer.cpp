#include "optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "host_reads.hpp"
#include "memory_accounting.hpp"

namespace tightfit {

Optimizer::Clip Optimizer::clip(const std::vector<Param*>& params, double held_norm_sq,
                                PendingReads* pending) {
  std::vector<at::Tensor> grads;
  for (const Param* p : params)
    if (p->value.grad().defined()) grads.push_back(p->value.grad());
  double sq = held_norm_sq;
  if (!grads.empty()) {
    CategoryScope scope(TF_MEM_TRANSIENT);
    at::NoGradGuard no_grad;
    // Each gradient's norm in fp32 (as torch.nn.utils.clip_grad_norm_), their
    // squares summed in fp64 on the device: one read for all of them.
    std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2, at::kFloat);
    const at::Device where = norms.front().device();
    for (at::Tensor& n : norms)
      if (n.device() != where) n = n.to(where);  // stages on several devices
    const at::Tensor sum_sq = at::stack(norms).to(at::kDouble).square().sum();
    sq += pending ? pending->read_with({sum_sq})[0] : read_value(sum_sq);
  } else if (pending) {
    pending->read_with();  // every gradient held by strategies: the losses alone
  }
  Clip c;
  c.norm = std::sqrt(sq);
  if (cfg_.grad_clip > 0 && std::isfinite(c.norm) && c.norm > cfg_.grad_clip) {
    c.scale = cfg_.grad_clip / (c.norm + 1e-6);
    at::NoGradGuard no_grad;
    if (!grads.empty()) at::_foreach_mul_(grads, c.scale);  // (all may be held by strategies)
  }
  return c;
}

std::vector<std::string> Optimizer::slot_names() const {
  if (cfg_.name == "sgd")
    return cfg_.momentum > 0 ? std::vector<std::string>{"momentum_buffer"}
                             : std::vector<std::string>{};
  return {"exp_avg", "exp_avg_sq"};
}

std::vector<at::Tensor*> Optimizer::slots_of(const Param& p) {
  std::vector<at::Tensor*> slots;
  for (const auto& slot : slot_names()) {
    at::Tensor& t = state_[p.name + "." + slot];
    if (!t.defined()) {
      CategoryScope scope(TF_MEM_OPTIMIZER);
      t = at::zeros(p.value.sizes(), p.value.options().dtype(at::kFloat));
    }
    slots.push_back(&t);
  }
  return slots;
}

void Optimizer::update(Param& p, const at::Tensor& grad, int64_t step) {
  update_many({Item{p.value, p.decays(), grad, slots_of(p), step < 0 ? steps_ : step}});
}

void Optimizer::update_with_state(const at::Tensor& value, bool decays, const at::Tensor& grad,
                                  const std::vector<at::Tensor*>& slots, int64_t step) {
  update_many({Item{value, decays, grad, slots, step < 0 ? steps_ : step}});
}

namespace {

bool low_precision(const at::Tensor& t) {
  return t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble;
}

// The tensors of `list` at `at`.
std::vector<at::Tensor> pick(const std::vector<at::Tensor>& list, const std::vector<size_t>& at) {
  std::vector<at::Tensor> out;
  out.reserve(at.size());
  for (size_t i : at) out.push_back(list[i]);
  return out;
}

}  // namespace

int64_t Optimizer::group_elements(int64_t largest, int64_t total, bool low) {
  constexpr int64_t kCap = int64_t{1} << 22, kGroups = 32;
  if (low) return largest;
  return std::max(largest, std::min(kCap, (total + kGroups - 1) / kGroups));
}

void Optimizer::update_many(const std::vector<Item>& items) {
  const size_t n_slots = slot_names().size();
  int64_t largest = 0, total = 0;
  bool low = false;
  for (const Item& it : items) {
    if (it.slots.size() != n_slots)
      throw std::invalid_argument("optimizer " + cfg_.name + " needs " + std::to_string(n_slots) +
                                  " state tensors, got " + std::to_string(it.slots.size()));
    for (const at::Tensor* t : it.slots)
      if (!t->defined() || t->sizes() != it.value.sizes() || t->scalar_type() != at::kFloat)
        throw std::invalid_argument(
            "optimizer state must be fp32 tensors shaped like the parameter");
    largest = std::max<int64_t>(largest, it.value.numel());
    total += it.value.numel();
    low = low || low_precision(it.value);
  }
  const int64_t limit = group_elements(largest, total, low);
  for (size_t begin = 0; begin < items.size();) {
    size_t end = begin;
    int64_t elements = 0;
    do {
      elements += items[end].value.numel();
      ++end;
    } while (end < items.size() && elements + items[end].value.numel() <= limit);
    update_group(items, begin, end);
    begin = end;
  }
}

void Optimizer::update_group(const std::vector<Item>& items, size_t begin, size_t end) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params, grads, low_values, low_params;
  std::vector<size_t> decaying;
  std::vector<int64_t> steps;
  for (size_t i = begin; i < end; ++i) {
    const Item& it = items[i];
    // Low-precision weights are updated in fp32 and rounded once at the
    // end; their optimizer state is fp32 (small steps are not lost to bf16
    // spacing).
    // (No detach: under the no-grad guard the in-place updates of a leaf
    // are not recorded, as in torch.optim; one op a parameter fewer.)
    at::Tensor param = it.value;
    if (low_precision(it.value)) {
      CategoryScope scope(TF_MEM_TRANSIENT);  // the fp32 working copy lives for this group
      param = it.value.to(at::kFloat);
      low_values.push_back(it.value);
      low_params.push_back(param);
    }
    // The gradient in fp32 counts where the caller counts (the optimizer's
    // category: the precision plugin plans one parameter's worth there).
    at::Tensor grad =
        it.grad.scalar_type() == param.scalar_type() ? it.grad : it.grad.to(param.scalar_type());
    if (it.decays && cfg_.weight_decay > 0) decaying.push_back(params.size());
    params.push_back(std::move(param));
    grads.push_back(std::move(grad));
    steps.push_back(it.step);
  }
  const auto slot = [&](size_t k) {
    std::vector<at::Tensor> out;
    for (size_t i = begin; i < end; ++i) out.push_back(*items[i].slots[k]);
    return out;
  };
  if (cfg_.name == "sgd") {
    if (!decaying.empty()) {
      // grad + wd * param, on the decaying parameters' gradients only.
      const std::vector<at::Tensor> decayed =
          at::_foreach_add(pick(grads, decaying), pick(params, decaying), cfg_.weight_decay);
      for (size_t j = 0; j < decaying.size(); ++j) grads[decaying[j]] = decayed[j];
    }
    if (cfg_.momentum > 0) {
      // From a zero buffer the first step's buffer is the gradient, as in torch.optim.SGD.
      std::vector<at::Tensor> bufs = slot(0);
      at::_foreach_mul_(bufs, cfg_.momentum);
      at::_foreach_add_(bufs, grads);
      grads = bufs;
    }
    at::_foreach_add_(params, grads, -lr_);
  } else if (cfg_.fused) {
    fused_adamw(params, grads, slot(0), slot(1), steps, decaying);
  } else {
    std::vector<at::Tensor> m = slot(0), v = slot(1);
    // Decoupled weight decay (Loshchilov & Hutter): p <- p (1 - lr wd).
    if (!decaying.empty()) at::_foreach_mul_(pick(params, decaying), 1.0 - lr_ * cfg_.weight_decay);
    at::_foreach_mul_(m, cfg_.beta1);
    at::_foreach_add_(m, grads, 1.0 - cfg_.beta1);
    at::_foreach_mul_(v, cfg_.beta2);
    at::_foreach_addcmul_(v, grads, grads, 1.0 - cfg_.beta2);
    // Each parameter's own bias corrections (its own step count).
    std::vector<at::Scalar> bc2, step_size;
    for (const int64_t step : steps) {
      const double s = static_cast<double>(step);
      bc2.emplace_back(1.0 - std::pow(cfg_.beta2, s));
      step_size.emplace_back(-lr_ / (1.0 - std::pow(cfg_.beta1, s)));
    }
    CategoryScope scope(TF_MEM_TRANSIENT);
    std::vector<at::Tensor> denom = at::_foreach_div(v, bc2);
    at::_foreach_sqrt_(denom);
    at::_foreach_add_(denom, cfg_.eps);
    at::_foreach_addcdiv_(params, m, denom, step_size);
  }
  if (!low_values.empty()) at::_foreach_copy_(low_values, low_params);
}

void Optimizer::fused_adamw(const std::vector<at::Tensor>& params,
                            const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& m,
                            const std::vector<at::Tensor>& v, const std::vector<int64_t>& steps,
                            const std::vector<size_t>& decaying) {
  // One call per device and weight decay, as torch.optim.AdamW(fused=True)
  // makes one per device and parameter group; its step counts are fp32
  // scalars on the parameters' device, made there (no copy from the host).
  std::vector<bool> decays(params.size(), false);
  for (const size_t j : decaying) decays[j] = true;
  std::vector<bool> done(params.size(), false);
  for (size_t first = 0; first < params.size(); ++first) {
    if (done[first]) continue;
    std::vector<at::Tensor> p, g, m1, v1, step;
    for (size_t i = first; i < params.size(); ++i) {
      if (done[i] || decays[i] != decays[first] || params[i].device() != params[first].device())
        continue;
      done[i] = true;
      p.push_back(params[i]);
      g.push_back(grads[i]);
      m1.push_back(m[i]);
      v1.push_back(v[i]);
      step.push_back(
          at::full({}, static_cast<double>(steps[i]), params[i].options().dtype(at::kFloat)));
    }
    at::_fused_adamw_(p, g, m1, v1, {}, step, lr_, cfg_.beta1, cfg_.beta2,
                      decays[first] ? cfg_.weight_decay : 0.0, cfg_.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
    ++fused_launches_;
  }
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& [k, t] : state_) n += t.numel() * t.element_size();
  return n;
}

}  // namespace tightfit
