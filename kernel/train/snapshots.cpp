// Snapshots and perturbations (snapshots.hpp).
#include "snapshots.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

#include "memory_accounting.hpp"

namespace tightfit {
int32_t Snapshots::take(bool with_optimizer) {
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  std::map<std::string, at::Tensor> snap;
  for (Param* p : store_.trainable())
    executor_.with_resident(*p, [&] { snap["param:" + p->name] = p->value.detach().clone(); });
  if (with_optimizer)
    for (auto& [k, t] : update_.optimizer().state()) snap["opt:" + k] = t.clone();
  const int32_t id = next_id_++;
  snapshots_[id] = std::move(snap);
  return id;
}

void Snapshots::restore(int32_t id) {
  auto it = snapshots_.find(id);
  if (it == snapshots_.end()) throw std::out_of_range("no snapshot " + std::to_string(id));
  at::NoGradGuard no_grad;
  for (auto& [k, t] : it->second) {
    if (k.rfind("param:", 0) == 0) {
      Param& p = store_.get(k.substr(6));
      executor_.with_resident(p, [&] { p.value.copy_(t); });
    } else
      update_.optimizer().state()[k.substr(4)].copy_(t);
  }
}

void Snapshots::drop(int32_t id) {
  if (snapshots_.erase(id) == 0) throw std::out_of_range("no snapshot " + std::to_string(id));
}

void Snapshots::perturb_params(uint64_t seed, double scale) {
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (Param* p : store_.trainable()) {
    at::Tensor z = at::empty(p->value.sizes(), at::kFloat).normal_(0, 1, gen);
    executor_.with_resident(
        *p, [&] { p->value.add_(z.to(p->value.device(), p->value.scalar_type()), scale); });
  }
}

}  // namespace tightfit
