// In-memory snapshots of weights (and optimizer state) for schedules that
// try a step and go back (MeZO, hybrid), and seeded perturbations.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "cross_entropy.hpp"
#include "cuda_memory.hpp"
#include "data_setup.hpp"
#include "device_spec.hpp"
#include "file_util.hpp"
#include "generation.hpp"
#include "hf_shards.hpp"
#include "hf_weights.hpp"
#include "kernel_keys.hpp"
#include "logging.hpp"
#include "op_timer.hpp"
#include "safetensors.hpp"
#include "session.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
namespace fs = std::filesystem;

int32_t Session::snapshot_take(bool with_optimizer) {
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  std::map<std::string, at::Tensor> snap;
  for (Param* p : store_.trainable())
    with_resident(*p, [&] { snap["param:" + p->name] = p->value.detach().clone(); });
  if (with_optimizer)
    for (auto& [k, t] : optimizer_->state()) snap["opt:" + k] = t.clone();
  const int32_t id = next_snapshot_++;
  snapshots_[id] = std::move(snap);
  return id;
}

void Session::snapshot_restore(int32_t id) {
  auto it = snapshots_.find(id);
  if (it == snapshots_.end()) throw std::out_of_range("no snapshot " + std::to_string(id));
  at::NoGradGuard no_grad;
  for (auto& [k, t] : it->second) {
    if (k.rfind("param:", 0) == 0) {
      Param& p = store_.get(k.substr(6));
      with_resident(p, [&] { p.value.copy_(t); });
    } else
      optimizer_->state()[k.substr(4)].copy_(t);
  }
}

void Session::snapshot_drop(int32_t id) {
  if (snapshots_.erase(id) == 0) throw std::out_of_range("no snapshot " + std::to_string(id));
}

void Session::perturb_params(uint64_t seed, double scale) {
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (Param* p : store_.trainable()) {
    at::Tensor z = at::empty(p->value.sizes(), at::kFloat).normal_(0, 1, gen);
    with_resident(*p,
                  [&] { p->value.add_(z.to(p->value.device(), p->value.scalar_type()), scale); });
  }
}

}  // namespace tightfit
