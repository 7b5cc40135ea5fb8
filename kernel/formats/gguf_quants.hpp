// ggml's block formats, decoded to float32 as ggml's reference
// dequantizers (and the gguf Python package) do, value for value: the same
// products in the same order, rounded to float32 at the same steps.
#pragma once

#include <cstdint>

#include "gguf_types.hpp"

namespace tightfit::gguf {

// Whether `type` can be decoded here (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K).
bool can_dequantize(const TensorType& type);

// Decodes `n` elements (a whole number of the type's blocks) from `src`,
// which holds n / block * bytes bytes, into `dst`. Throws GgufError for a
// type can_dequantize refuses.
void dequantize(const TensorType& type, const uint8_t* src, int64_t n, float* dst);

// Whether `type` can be written here (F32, F16, BF16, Q8_0): the types
// llama.cpp's converters write themselves; other quants are llama-quantize's.
bool can_quantize(const TensorType& type);

// Encodes `n` float32 elements (a whole number of the type's blocks) into
// n / block * bytes bytes at `dst`, byte for byte as the gguf Python
// package's quants.quantize and ggml's reference quantizers do. Throws
// GgufError for a type can_quantize refuses.
void quantize(const TensorType& type, const float* src, int64_t n, uint8_t* dst);

}  // namespace tightfit::gguf
