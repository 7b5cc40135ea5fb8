// The writing half of gguf_quants.hpp: float32 into F32, F16, BF16 and Q8_0
// blocks, bit for bit as the gguf Python package (and ggml's reference C)
// writes them.
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>

#include "gguf_quants.hpp"

namespace tightfit::gguf {
namespace {

void put_f16(float x, uint8_t* dst) {
  const uint16_t bits = c10::Half(x).x;  // round to nearest, ties to even (as numpy's astype)
  std::memcpy(dst, &bits, 2);
}

// ggml_compute_fp32_to_bf16: a NaN stays a (quiet) NaN, the rest rounds to
// nearest, ties to even.
void put_bf16(float x, uint8_t* dst) {
  uint32_t n;
  std::memcpy(&n, &x, 4);
  if ((n & 0x7fffffffu) > 0x7f800000u) n = (n & 0xffff0000u) | (64u << 16);
  const auto bits =
      static_cast<uint16_t>((static_cast<uint64_t>(n) + (0x7fffu + ((n >> 16) & 1u))) >> 16);
  std::memcpy(dst, &bits, 2);
}

// Q8_0: d = max|x| / 127 as f16, then 32 int8 q = round(x / d), halves away
// from zero (quantize_row_q8_0_ref: x * (1 / d) in float32).
void put_q8_0(const float* x, uint8_t* dst) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  put_f16(d, dst);
  for (int j = 0; j < 32; ++j) {
    const auto q = static_cast<int8_t>(std::roundf(x[j] * id));
    std::memcpy(dst + 2 + j, &q, 1);
  }
}

}  // namespace

bool can_quantize(const TensorType& type) {
  return type.id == 0 || type.id == 1 || type.id == 30 || type.id == 8;
}

void quantize(const TensorType& type, const float* src, int64_t n, uint8_t* dst) {
  if (!can_quantize(type))
    throw GgufError(std::string("tightfit writes GGUF tensors as F32, F16, BF16 or Q8_0, not ") +
                    type.name + " (llama.cpp's llama-quantize makes the others from an F16 file)");
  const int64_t blocks = n / type.block;
  at::parallel_for(0, blocks, 4096 / type.block + 1, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      switch (type.id) {
        case 0:
          std::memcpy(dst + 4 * i, src + i, 4);
          break;
        case 1:
          put_f16(src[i], dst + 2 * i);
          break;
        case 30:
          put_bf16(src[i], dst + 2 * i);
          break;
        default:
          put_q8_0(src + 32 * i, dst + 34 * i);
      }
    }
  });
}

}  // namespace tightfit::gguf
