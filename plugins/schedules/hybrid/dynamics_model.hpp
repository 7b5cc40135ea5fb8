// The hybrid schedule's learned dynamics model: it predicts the next weight
// update of every parameter group from the recent history of updates, and
// says how far to trust the prediction.
//
// For group g (one trainable tensor), with updates measured per unit of
// learning rate (u_t = (theta_{t+1} - theta_t) / lr_t, so a decaying lr does
// not read as a change of dynamics):
//
//   m_t       = beta m_{t-1} + (1 - beta) u_t          (long memory of the direction)
//   u_hat_t+1 = a_g u_t + b_g m_t                      (the prediction)
//
// (a_g, b_g) solve the least-squares problem over the observed full steps,
// weighted by rho^age (exponentially forgotten normal equations), so the
// model learns how much of the last update persists and how much of the
// long direction. Before each fit the current (a_g, b_g) predict the update
// about to be observed; the cosine between that out-of-sample prediction and
// the real update, averaged with the same forgetting, is the group's
// confidence. The model's confidence is the groups' confidences weighted by
// their update energy (|u|^2), so the groups that move the weights most count
// most. While predicting, the model feeds its own prediction back as the
// newest update (a rollout), so the predicted updates follow the learned
// dynamics rather than repeat one step.
#pragma once

#include <ATen/ATen.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

namespace tf_hybrid {

struct GroupState {
  std::string name;
  at::Tensor last;     // u_t
  at::Tensor memory;   // m_t
  at::Tensor scratch;  // weights before a measured step; the prediction while predicting
  // Exponentially weighted normal equations: <l,l>, <l,m>, <m,m>, <u,l>, <u,m>.
  double s_ll = 0, s_lm = 0, s_mm = 0, s_ul = 0, s_um = 0;
  double a = 1, b = 0;
  double confidence = 0;  // forgotten mean of out-of-sample cos(u_hat, u)
  double energy = 0;      // forgotten mean of |u|^2
  int64_t observed = 0;
};

// The statistics one measured step contributes, per group and in total.
struct Observation {
  double cosine = 0;          // energy-weighted out-of-sample cos(u_hat, u) this step
  double relative_error = 0;  // |u - u_hat| / |u| over all groups
  bool measured = false;      // false on a group's first observation
};

class DynamicsModel {
 public:
  DynamicsModel(double beta, double rho) : beta_(beta), rho_(rho) {}

  // Groups are created on first sight (a parameter that became trainable
  // later, as LISA does, joins then), with fp32 history on `like`'s device.
  GroupState& group(const std::string& name, const at::Tensor& like);
  GroupState* find(const std::string& name);
  std::deque<GroupState>& groups() { return groups_; }

  // Before a measured step: remember the weights.
  static void begin_measure(GroupState& g, const at::Tensor& weights);
  // After it: the update is (weights - remembered) / lr. Returns the per-group
  // statistics to fold in with `observe` once every group has its numbers
  // (one device-to-host copy for all groups).
  at::Tensor end_measure(GroupState& g, const at::Tensor& weights, double lr) const;
  // Folds one step's statistics (rows from end_measure, in `groups` order) in.
  Observation observe(const std::vector<GroupState*>& groups, const at::Tensor& stats);

  // The predicted next update per unit lr, rolled forward into the model's
  // history; returns the tensor to add (times lr) to the weights.
  const at::Tensor& predict_next(GroupState& g);

  // Energy-weighted confidence over the groups that have been measured twice.
  double confidence() const;
  bool ready() const;
  // After a divergence the model must earn trust again.
  void distrust();

 private:
  void fit(GroupState& g) const;
  double beta_;
  double rho_;
  std::deque<GroupState> groups_;  // a deque: references stay valid as groups join
  std::map<std::string, size_t> index_;
};

}  // namespace tf_hybrid
