// The parameter store: owns every parameter — shape, dtype, format, residency,
// trainability — so model code never holds weights and strategies can change
// how they are stored without the model knowing.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tightfit/plugin_api.h"

namespace tightfit {

struct Param {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  int32_t stage = -1;
  tf_init_kind init = TF_INIT_NORMAL;
  double init_std = 0.02;
  uint32_t flags = 0;
  // The share of a pass's tokens expected to use it (ABI 1.17: a routed
  // expert's top_k / n_experts); 0 = every token.
  double routed_share = 0;
  bool trainable = true;
  tf_param_format format = TF_FORMAT_DENSE;
  tf_residency residency = TF_TIER_DEVICE;
  // The stored tensor. For dense parameters on the device it is the autograd
  // leaf the model computes with; its .grad() is the parameter's gradient.
  at::Tensor value;
  // Never materialized: its stage is skipped (sparse), so it has no bytes, is
  // not trained and is not loaded; `value` is an empty placeholder.
  bool absent = false;
  // A frozen copy of another parameter (ABI 1.19 declare_param_copies, a
  // reference model's weights): that one's name, whose values it starts
  // from (the weights file's tensor of that name, or the same initial draw).
  std::string copy_of;
  // A copy the kernel keeps (ABI 1.24 declare_kept_param_copies): dense in
  // `residency` (the device, or host memory), out of the strategies' sight;
  // `value` stays undefined until take_kept_copies (or a checkpoint) fills it.
  bool kept_by_host = false;

  int64_t numel() const;
  // The name its values are read under from a weights file.
  const std::string& source_name() const { return copy_of.empty() ? name : copy_of; }
  bool decays() const { return !(flags & TF_PARAM_NO_WEIGHT_DECAY) && shape.size() >= 2; }
};

at::ScalarType to_scalar_type(tf_dtype d);
tf_dtype to_tf_dtype(at::ScalarType t);

// A parameter's initial values, stored as p.dtype on `device`. They are
// drawn in fp32 on the CPU (every device and dtype starts from the same
// numbers) from the stream init_stream_key(seed, name) (initial_draws.hpp),
// the name being that of the parameter a copy copies, value i at the
// stream's position i. So the numbers are a function of the seed, the name
// and the position alone: chunks of kInitChunkValues are drawn in parallel
// (the same numbers on any number of threads and any CPU), and no
// parameter's values depend on which others exist, are absent or are read
// from a file instead. A parameter not kept as CPU fp32 is converted into
// place a chunk at a time, so no whole fp32 copy lives beside it (a
// 514M-value bf16 embedding's 2 GB at set-up): one fp32 chunk per thread at
// most.
inline constexpr int64_t kInitChunkValues = int64_t{1} << 20;
at::Tensor initial_values(const Param& p, const at::Device& device, uint64_t seed);

class ParamStore {
 public:
  // Throws std::invalid_argument on a duplicate or malformed spec.
  void declare(const tf_param_spec& spec);

  // Adds an already materialized parameter (export views of a store).
  void adopt(Param p);

  // Declares `prefix` + name, a frozen copy (TF_PARAM_COPY), of every
  // trainable parameter that is not an adapter; returns how many. Throws
  // std::invalid_argument on an empty prefix or one a declared name starts with.
  // kept_in: the copies are the kernel's (kept_by_host), in that tier
  // (TF_TIER_DEVICE or TF_TIER_HOST), declared after every other parameter.
  int32_t declare_copies(const std::string& prefix,
                         std::optional<tf_residency> kept_in = std::nullopt);
  // Whether copies were declared under `prefix`.
  bool has_copies(const std::string& prefix) const;

  // Allocates every parameter on the device place(param) names and fills it
  // with its initial values from `seed` (initial_values), unless
  // drawn(param) says the caller fills it itself (read from a weights file):
  // then it is allocated and nothing is drawn. Where place names no device
  // the parameter stays absent. After each run of consecutive parameters of
  // one stage, calls after_group(first, last) with their index range, so the
  // caller can load and convert them before the next run is allocated (a
  // model larger than memory is never whole).
  void materialize(uint64_t seed,
                   const std::function<std::optional<at::Device>(const Param&)>& place,
                   const std::function<void(size_t first, size_t last)>& after_group = {},
                   const std::function<bool(const Param&)>& drawn = {});
  bool materialized() const { return materialized_; }
  // How many parameters the plugins see (param_count): all but the copies
  // the kernel keeps, which come last.
  size_t plugins_see() const { return params_.size() - kept_; }
  // Fills every kept copy not filled yet with its parameter's values as they
  // are now, dense, in the copy's tier (pinned host memory beside a GPU
  // weight). Throws, by name, when the parameter is not a dense weight in
  // the device tier (a strategy converted or moved it).
  void take_kept_copies();
  // Where a kept copy's values go: `values` placed as `copy` keeps them.
  static at::Tensor kept_copy_of(const Param& copy, const at::Tensor& values,
                                 const at::Tensor& beside);

  Param& get(const std::string& name);
  const Param& get(const std::string& name) const;
  Param* find(const std::string& name);
  const Param* find(const std::string& name) const;
  std::vector<Param>& all() { return params_; }
  const std::vector<Param>& all() const { return params_; }
  std::vector<Param*> trainable();

  void set_trainable(Param& p, bool on);
  int64_t count_params(bool trainable_only) const;
  int64_t stored_bytes() const;

 private:
  // The parameter each kept copy copies is a dense weight on the device.
  void check_kept_copies() const;

  int64_t total_elements_ = 0;
  size_t kept_ = 0;  // copies kept by the kernel, the last entries of params_  // of the declared
                     // parameters, bounded by checked_product
  std::vector<Param> params_;
  std::unordered_map<std::string, size_t> index_;
  bool materialized_ = false;
};

}  // namespace tightfit
