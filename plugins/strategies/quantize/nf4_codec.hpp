// NormalFloat4 (Dettmers et al. 2023): values in blocks, each block divided
// by its absmax and rounded to the nearest of 16 levels spaced as the
// quantiles of a normal distribution; two 4-bit codes a byte, the first
// element in the high half. Bit for bit the same codes and values on the
// CPU's one-pass loops as on the tensor ops other devices use.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <utility>

namespace nf4 {

inline constexpr std::array<float, 16> kLevels = {-1.0f,
                                                  -0.6961928009986877f,
                                                  -0.5250730514526367f,
                                                  -0.39491748809814453f,
                                                  -0.28444138169288635f,
                                                  -0.18477343022823334f,
                                                  -0.09105003625154495f,
                                                  0.0f,
                                                  0.07958029955625534f,
                                                  0.16093020141124725f,
                                                  0.24611230194568634f,
                                                  0.33791524171829224f,
                                                  0.44070982933044434f,
                                                  0.5626170039176941f,
                                                  0.7229568362236023f,
                                                  1.0f};

// The packed codes of w's values in blocks of `block` (the last one padded
// with zeros; (n_blocks * block + 1) / 2 bytes) and each block's fp32 absmax.
std::pair<at::Tensor, at::Tensor> encode(const at::Tensor& w, int64_t block);

// n values of `dtype` from packed codes and each block's fp32 absmax.
at::Tensor decode(const at::Tensor& packed, const at::Tensor& absmax, int64_t n, int64_t block,
                  at::ScalarType dtype);

// The tensor ops other devices (and dtypes other than fp32 and bf16) use,
// callable on the CPU so tests can hold the CPU loops to them bit for bit.
std::pair<at::Tensor, at::Tensor> encode_with_tensor_ops(const at::Tensor& w, int64_t block);
at::Tensor decode_with_tensor_ops(const at::Tensor& packed, const at::Tensor& absmax, int64_t n,
                                  int64_t block, at::ScalarType dtype);

}  // namespace nf4
