// 8-bit AdamW: the run's AdamW with its two moments stored as block-wise
// int8 codes (bitsandbytes' blockwise 8-bit optimizers, Dettmers et al.
// 2022): the first moment signed, the square root of the second unsigned
// (the root narrows its dynamic range, as bitsandbytes' non-linear maps do),
// each block of `block` values with one fp32 absmax. Two bytes a value
// instead of eight. Used by the adamw8 strategy and by quantize's
// optimizer_state = "int8" (the same code, the same bits).
#pragma once

#include <map>
#include <string>

#include "tightfit/plugin_sdk.hpp"

namespace adamw8 {

struct ParamState {
  at::Tensor m_codes, m_absmax, r_codes, r_absmax;
};

class State {
 public:
  explicit State(int64_t block) : block_(block) {}

  // optimizer_step_param: updates `param` from `grad` at `lr` with the run's
  // AdamW settings. Throws when the run's optimizer is not AdamW.
  tf_status step(const tf_sdk::Host& host, const char* name, const at::Tensor& param,
                 const at::Tensor& grad, double lr);
  // Checkpoint state under "adam8.<param>.<part>" (the keys quantize has
  // always written, so its checkpoints resume either way).
  void save(const tf_sdk::Host& host) const;
  void load(const tf_sdk::Host& host);
  // The optimizer delta of `trainable` values in 8 bits: two int8 moments
  // and their fp32 block scales instead of two fp32 moments.
  int64_t optimizer_delta(int64_t trainable) const {
    return -8 * trainable + 2 * trainable + 2 * 4 * (trainable / block_ + 1);
  }
  int64_t block() const { return block_; }

 private:
  int64_t block_;
  std::map<std::string, ParamState> params_;
};

}  // namespace adamw8
