// In-memory snapshots of the trainable weights (and optimizer state) for
// schedules that try a step and go back (MeZO, hybrid), and the seeded
// perturbations zeroth-order schedules make.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>

#include "executor.hpp"
#include "param_store.hpp"
#include "update_step.hpp"

namespace tightfit {

class Snapshots {
 public:
  Snapshots(ParamStore& store, Executor& executor, UpdateStep& update)
      : store_(store), executor_(executor), update_(update) {}
  Snapshots(const Snapshots&) = delete;
  Snapshots& operator=(const Snapshots&) = delete;

  int32_t take(bool with_optimizer);
  // Throws std::out_of_range for an id not taken (or dropped).
  void restore(int32_t id);
  void drop(int32_t id);
  // Every trainable weight += scale * z, z ~ N(0, 1) drawn from `seed` (the
  // same z for the same seed, as MeZO needs).
  void perturb_params(uint64_t seed, double scale);

 private:
  ParamStore& store_;
  Executor& executor_;
  UpdateStep& update_;
  std::map<int32_t, std::map<std::string, at::Tensor>> snapshots_;
  int32_t next_id_ = 1;
};

}  // namespace tightfit
