// Rotary position embeddings (Su et al. 2021) with the scalings Hugging Face
// configs name, computed as transformers' modeling_rope_utils computes them.
#pragma once

#include <ATen/ATen.h>

#include "decoder_shape.hpp"

namespace llama {

struct Rope {
  at::Tensor inv_freq;             // [head_dim / 2], fp32
  double attention_scaling = 1.0;  // multiplies cos and sin (YaRN's attention factor)
};

// linear divides every frequency by the factor; llama3 divides the low ones
// and blends the middle band; yarn interpolates by a ramp between beta_fast
// and beta_slow rotations and scales attention. "dynamic" (NTK) changes the
// base only past max_position_embeddings, which tightfit refuses to run, so
// within the model's context it equals the unscaled frequencies.
Rope make_rope(const Shape& s);

}  // namespace llama
