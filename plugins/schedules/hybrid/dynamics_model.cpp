#include "dynamics_model.hpp"

#include <algorithm>
#include <cmath>

namespace tf_hybrid {

GroupState& DynamicsModel::group(const std::string& name, const at::Tensor& like) {
  if (GroupState* g = find(name)) return *g;
  GroupState g;
  g.name = name;
  const auto opts = like.options().dtype(at::kFloat);
  g.last = at::zeros(like.sizes(), opts);
  g.memory = at::zeros(like.sizes(), opts);
  g.scratch = at::zeros(like.sizes(), opts);
  index_[name] = groups_.size();
  groups_.push_back(std::move(g));
  return groups_.back();
}

GroupState* DynamicsModel::find(const std::string& name) {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &groups_[it->second];
}

void DynamicsModel::begin_measure(GroupState& g, const at::Tensor& weights) {
  g.scratch.copy_(weights);
}

at::Tensor DynamicsModel::end_measure(GroupState& g, const at::Tensor& weights, double lr) const {
  at::Tensor& u = g.scratch;
  u.sub_(weights).mul_(-1.0 / lr);  // (weights - before) / lr
  const at::Tensor uf = u.flatten(), lf = g.last.flatten(), mf = g.memory.flatten();
  // The regressors are the history before this update: statistics first.
  at::Tensor stats = at::stack({at::dot(uf, lf), at::dot(uf, mf), at::dot(lf, lf), at::dot(lf, mf),
                                at::dot(mf, mf), at::dot(uf, uf)})
                         .to(at::kDouble);
  if (g.observed == 0)
    g.memory.copy_(u);
  else
    g.memory.mul_(beta_).add_(u, 1 - beta_);
  std::swap(g.last, g.scratch);
  return stats;
}

void DynamicsModel::fit(GroupState& g) const {
  // Ridge keeps the 2x2 solve sane when u_t and m_t point the same way.
  const double ridge = 1e-6 * (g.s_ll + g.s_mm) + 1e-30;
  const double p = g.s_ll + ridge, q = g.s_mm + ridge;
  const double det = p * q - g.s_lm * g.s_lm;
  double a = 0, b = 0;
  if (det > 1e-9 * p * q) {
    a = (g.s_ul * q - g.s_um * g.s_lm) / det;
    b = (p * g.s_um - g.s_lm * g.s_ul) / det;
  } else {
    a = g.s_ul / p;
  }
  // |a| + |b| <= 1 keeps the rollout from growing: max(|u_k|, |m_k|) never
  // increases, so a long predict run cannot run away on its own.
  const double sum = std::abs(a) + std::abs(b);
  if (sum > 1) {
    a /= sum;
    b /= sum;
  }
  g.a = std::isfinite(a) ? a : 0;
  g.b = std::isfinite(b) ? b : 0;
}

Observation DynamicsModel::observe(const std::vector<GroupState*>& groups,
                                   const at::Tensor& stats) {
  const at::Tensor host = stats.to(at::kCPU).contiguous();
  const double* row = host.data_ptr<double>();
  Observation o;
  double weighted_cos = 0, energy = 0, err_sq = 0, norm_sq = 0;
  for (size_t i = 0; i < groups.size(); ++i, row += 6) {
    GroupState& g = *groups[i];
    const double ul = row[0], um = row[1], ll = row[2], lm = row[3], mm = row[4], uu = row[5];
    if (g.observed > 0) {
      // The prediction the current fit made for this update (out of sample).
      const double dot = g.a * ul + g.b * um;
      const double nn = g.a * g.a * ll + 2 * g.a * g.b * lm + g.b * g.b * mm;
      const double cos = uu > 0 && nn > 0 ? dot / std::sqrt(uu * nn) : 0;
      g.confidence = rho_ * g.confidence + (1 - rho_) * cos;
      weighted_cos += uu * cos;
      energy += uu;
      err_sq += std::max(0.0, uu - 2 * dot + nn);
      norm_sq += uu;
      o.measured = true;
      g.s_ll = rho_ * g.s_ll + ll;
      g.s_lm = rho_ * g.s_lm + lm;
      g.s_mm = rho_ * g.s_mm + mm;
      g.s_ul = rho_ * g.s_ul + ul;
      g.s_um = rho_ * g.s_um + um;
      fit(g);
    }
    g.energy = g.observed == 0 ? uu : rho_ * g.energy + (1 - rho_) * uu;
    ++g.observed;
  }
  if (energy > 0) o.cosine = weighted_cos / energy;
  if (norm_sq > 0) o.relative_error = std::sqrt(err_sq / norm_sq);
  return o;
}

const at::Tensor& DynamicsModel::predict_next(GroupState& g) {
  at::Tensor& u_hat = g.scratch;
  at::mul_out(u_hat, g.last, g.a).add_(g.memory, g.b);
  g.memory.mul_(beta_).add_(u_hat, 1 - beta_);
  std::swap(g.last, g.scratch);
  return g.last;
}

double DynamicsModel::confidence() const {
  double weighted = 0, energy = 0;
  for (const auto& g : groups_)
    if (g.observed >= 2) {
      weighted += g.energy * g.confidence;
      energy += g.energy;
    }
  return energy > 0 ? weighted / energy : 0;
}

bool DynamicsModel::ready() const {
  return std::any_of(groups_.begin(), groups_.end(),
                     [](const GroupState& g) { return g.observed >= 2; });
}

void DynamicsModel::distrust() {
  for (auto& g : groups_) g.confidence = 0;
}

}  // namespace tf_hybrid
