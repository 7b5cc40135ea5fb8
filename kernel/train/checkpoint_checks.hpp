// What a checkpoint must hold to be saved or loaded: finite weights and
// optimizer state, and optimizer state that belongs to this run's
// parameters (names, shapes, dtypes; second moments never negative).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "param_store.hpp"

namespace tightfit {

// The name of the first floating-point tensor of `tensors` holding a NaN or
// an infinity, or "" when there is none.
std::string first_non_finite(const std::map<std::string, at::Tensor>& tensors);

// Checks optimizer state read from `file` against `store` and the
// optimizer's `slots` ("exp_avg", "exp_avg_sq", ...); a parameter frozen now may
// have state (sparse/LISA re-picks what trains). Throws
// std::runtime_error naming the file, the entry and what is wrong.
void validate_optimizer_state(const std::map<std::string, at::Tensor>& state,
                              const ParamStore& store, const std::vector<std::string>& slots,
                              const std::string& file);

}  // namespace tightfit
