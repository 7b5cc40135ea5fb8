// Rotary position embeddings (Su et al. 2021) with the scalings Hugging Face
// configs name, computed as transformers' modeling_rope_utils computes them.
#pragma once

#include <ATen/ATen.h>

#include "decoder_shape.hpp"

namespace llama {

struct Rope {
  at::Tensor inv_freq;             // [rotary_dim / 2], fp32
  double attention_scaling = 1.0;  // multiplies cos and sin (YaRN's, LongRoPE's attention factor)
  // LongRoPE: the frequencies of a pass whose positions reach past
  // `long_after` (transformers' choice per forward call); undefined: none.
  at::Tensor inv_freq_long;
  int64_t long_after = 0;
};

// linear divides every frequency by the factor; llama3 divides the low ones
// and blends the middle band; yarn interpolates by a ramp between beta_fast
// and beta_slow rotations and scales attention. "dynamic" (NTK) changes the
// base only past max_position_embeddings, which tightfit refuses to run, so
// within the model's context it equals the unscaled frequencies. longrope
// divides each frequency by its short or long factor and scales attention by
// sqrt(1 + ln(max / original) / ln(original)).
Rope make_rope(const Shape& s);

}  // namespace llama
