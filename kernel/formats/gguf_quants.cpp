#include "gguf_quants.hpp"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>
#include <string>

// Built with -ffp-contract=off (kernel/CMakeLists.txt): `d * q + m` must
// round twice, as ggml's reference C and numpy do, on a CPU with FMA too.

namespace tightfit::gguf {
namespace {

constexpr int64_t kQK = 256;  // QK_K: the K-quants' super-block

float f16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// Q4_0: d (f16), 16 bytes of nibbles; element j is the low nibble of byte
// j, element j + 16 its high nibble; value (q - 8) * d.
void q4_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: d, m (f16), nibbles as Q4_0; value d * q + m.
void q4_1(const uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// Q5_0 / Q5_1: the fifth bit of element i is bit i of a little-endian
// 32-bit word before the nibbles.
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

void q5_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint32_t qh = le32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>((qh >> j) & 1) << 4;
    const int hi = (qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

void q5_1(const uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  const uint32_t qh = le32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>((qh >> j) & 1) << 4;
    const int hi = (qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

// Q8_0: d (f16), 32 int8; value q * d.
void q8_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// The K-quants' 8 six-bit scales and mins, packed in 12 bytes (ggml's
// get_scale_min_k4).
void scale_min_k4(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((s[j + 8] & 0x0F) | ((s[j] >> 6) << 4));
    mn[j + 4] = static_cast<uint8_t>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}

// Q4_K: d, dmin (f16), 12 bytes of scales, 128 bytes of nibbles: eight
// sub-blocks of 32, sub-block 2c the low nibbles of bytes 32c..32c+31 and
// 2c + 1 their high nibbles; value (d * sc) * q - (dmin * m).
void q4_k(const uint8_t* b, float* y) {
  const float d = f16(b), dmin = f16(b + 2);
  uint8_t sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  for (int s = 0; s < 8; ++s) {
    const float ds = d * static_cast<float>(sc[s]), dm = dmin * static_cast<float>(mn[s]);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    for (int l = 0; l < 32; ++l)
      y[32 * s + l] = ds * static_cast<float>((q[l] >> shift) & 0x0F) - dm;
  }
}

// Q5_K: as Q4_K with a fifth bit: bit s of byte l of 32 high-bit bytes
// (before the nibbles) for element l of sub-block s.
void q5_k(const uint8_t* b, float* y) {
  const float d = f16(b), dmin = f16(b + 2);
  uint8_t sc[8], mn[8];
  scale_min_k4(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int s = 0; s < 8; ++s) {
    const float ds = d * static_cast<float>(sc[s]), dm = dmin * static_cast<float>(mn[s]);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0F) | ((qh[l] >> s) & 1) << 4;
      y[32 * s + l] = ds * static_cast<float>(v) - dm;
    }
  }
}

// Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales,
// d (f16). Element e (of 256): half h = e / 128; its low four bits are
// nibble (e % 128) / 64 of byte 64h + e % 64, its high two bits pair
// (e % 128) / 32 of byte 32h + e % 32; value (d * scale[e / 16]) * (q - 32).
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16(b + 208);
  for (int e = 0; e < kQK; ++e) {
    const int h = e / 128, r = e % 128;
    const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
    const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
    const float ds = d * static_cast<float>(scales[e / 16]);
    y[e] = ds * static_cast<float>((lo | hi << 4) - 32);
  }
}

using BlockDecoder = void (*)(const uint8_t*, float*);

BlockDecoder block_decoder(uint32_t id) {
  switch (id) {
    case 2:
      return q4_0;
    case 3:
      return q4_1;
    case 6:
      return q5_0;
    case 7:
      return q5_1;
    case 8:
      return q8_0;
    case 12:
      return q4_k;
    case 13:
      return q5_k;
    case 14:
      return q6_k;
    default:
      return nullptr;
  }
}

}  // namespace

bool can_dequantize(const TensorType& type) {
  return type.id == 0 || type.id == 1 || type.id == 30 || block_decoder(type.id) != nullptr;
}

void dequantize(const TensorType& type, const uint8_t* src, int64_t n, float* dst) {
  if (!can_dequantize(type))
    throw GgufError(std::string("tensor type ") + type.name +
                    " is not one tightfit decodes (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                    "Q4_K, Q5_K, Q6_K): convert the file with llama.cpp's llama-quantize");
  const int64_t blocks = n / type.block;
  at::parallel_for(0, blocks, 4096 / type.block + 1, [&](int64_t b0, int64_t b1) {
    switch (type.id) {
      case 0:
        std::memcpy(dst + b0, src + 4 * b0, static_cast<size_t>(4 * (b1 - b0)));
        break;
      case 1:
        for (int64_t i = b0; i < b1; ++i) dst[i] = f16(src + 2 * i);
        break;
      case 30:
        for (int64_t i = b0; i < b1; ++i) {
          uint32_t bits = static_cast<uint32_t>(src[2 * i]) | static_cast<uint32_t>(src[2 * i + 1])
                                                                  << 8;
          bits <<= 16;
          std::memcpy(dst + i, &bits, 4);
        }
        break;
      default: {
        const BlockDecoder decode = block_decoder(type.id);
        for (int64_t i = b0; i < b1; ++i) decode(src + i * type.bytes, dst + i * type.block);
      }
    }
  });
}

}  // namespace tightfit::gguf
