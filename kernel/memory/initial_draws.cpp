// Compiled with -ffp-contract=off and -fno-math-errno (kernel/CMakeLists.txt):
// no multiply-add is fused on a CPU that has them, and sqrt is the
// instruction, so every clone computes the same bits.
#include "initial_draws.hpp"

#include <algorithm>
#include <cstring>

namespace tightfit {
namespace {

using U64x8 = uint64_t __attribute__((vector_size(64)));
using U32x16 = uint32_t __attribute__((vector_size(64)));
using I32x16 = int32_t __attribute__((vector_size(64)));
using F32x16 = float __attribute__((vector_size(64)));

constexpr int64_t kBlock = 32;  // values a block of 16 hashes makes
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;

uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The high and low 32-bit words of the hashes of counters 16b+1 .. 16b+16.
#define TF_BLOCK_WORDS(key, b, hi, lo)                                            \
  U64x8 c0, c1;                                                                   \
  for (int k = 0; k < 8; ++k) {                                                   \
    c0[k] = static_cast<uint64_t>(16 * (b) + k + 1);                              \
    c1[k] = static_cast<uint64_t>(16 * (b) + 8 + k + 1);                          \
  }                                                                               \
  U64x8 z0 = (key) + c0 * kGamma, z1 = (key) + c1 * kGamma;                       \
  z0 = (z0 ^ (z0 >> 30)) * 0xbf58476d1ce4e5b9ULL;                                 \
  z1 = (z1 ^ (z1 >> 30)) * 0xbf58476d1ce4e5b9ULL;                                 \
  z0 = (z0 ^ (z0 >> 27)) * 0x94d049bb133111ebULL;                                 \
  z1 = (z1 ^ (z1 >> 27)) * 0x94d049bb133111ebULL;                                 \
  z0 ^= z0 >> 31;                                                                 \
  z1 ^= z1 >> 31;                                                                 \
  U32x16 w0, w1;                                                                  \
  std::memcpy(&w0, &z0, sizeof w0);                                               \
  std::memcpy(&w1, &z1, sizeof w1);                                               \
  const U32x16 lo = __builtin_shuffle(                                            \
      w0, w1, U32x16{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}); \
  const U32x16 hi =                                                               \
      __builtin_shuffle(w0, w1, U32x16{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31})

constexpr float kTwoPow24 = 1.0f / 16777216.0f;

// Blocks b0 .. b0 + nb of the normal stream into out (nb * 32 values).
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void normal_blocks(
    uint64_t key, int64_t b0, int64_t nb, float std, float* out) {
  for (int64_t b = b0; b < b0 + nb; ++b, out += kBlock) {
    TF_BLOCK_WORDS(key, b, hi, lo);
    // u1 in (0, 1], u2 in [0, 1): 24 bits each, exact in fp32.
    const F32x16 u1 = __builtin_convertvector((I32x16)((hi >> 8) + 1), F32x16) * kTwoPow24;
    const F32x16 u2 = __builtin_convertvector((I32x16)(lo >> 8), F32x16) * kTwoPow24;

    // ln(u1), Cephes' logf: u1 = m 2^e with m in [sqrt(1/2), sqrt(2)).
    I32x16 bits;
    std::memcpy(&bits, &u1, sizeof bits);
    I32x16 e = ((bits >> 23) & 0xff) - 126;
    bits = (bits & 0x007fffff) | 0x3f000000;  // m in [0.5, 1)
    F32x16 m;
    std::memcpy(&m, &bits, sizeof m);
    const I32x16 small = m < 0.707106781186547524f;
    e += small;  // -1 where true
    F32x16 x = m - 1.0f;
    x = small ? x + m : x;  // 2m - 1 where m < sqrt(1/2)
    const F32x16 fe = __builtin_convertvector(e, F32x16);
    const F32x16 z = x * x;
    F32x16 y = 7.0376836292e-2f * x - 1.1514610310e-1f;
    y = y * x + 1.1676998740e-1f;
    y = y * x - 1.2420140846e-1f;
    y = y * x + 1.4249322787e-1f;
    y = y * x - 1.6668057665e-1f;
    y = y * x + 2.0000714765e-1f;
    y = y * x - 2.4999993993e-1f;
    y = y * x + 3.3333331174e-1f;
    y = y * x * z;
    y += fe * -2.12194440e-4f;
    y += z * -0.5f;
    const F32x16 ln = (x + y) + fe * 0.693359375f;

    F32x16 r = ln * -2.0f;
    for (int k = 0; k < 16; ++k) r[k] = __builtin_sqrtf(r[k] > 0.0f ? r[k] : 0.0f);

    // cos and sin of 2 pi u2: the quarter turn q nearest 4 u2, and the rest
    // a = (4 u2 - q) pi/2 in [-pi/4, pi/4], Cephes' sinf and cosf there.
    const F32x16 turns = u2 * 4.0f;
    const I32x16 q = __builtin_convertvector(turns + 0.5f, I32x16);
    const F32x16 a = (turns - __builtin_convertvector(q, F32x16)) * 1.57079632679489661923f;
    const F32x16 aa = a * a;
    F32x16 s = -1.9515295891e-4f * aa + 8.3321608736e-3f;
    s = s * aa - 1.6666654611e-1f;
    s = a + a * aa * s;
    F32x16 c = 2.443315711809948e-5f * aa - 1.388731625493765e-3f;
    c = c * aa + 4.166664568298827e-2f;
    c = 1.0f - aa * 0.5f + aa * aa * c;
    // Quarter turn q: (cos, sin) = (c, s), (-s, c), (-c, -s), (s, -c).
    const I32x16 odd = (q & 1) != 0;
    const F32x16 cos_mag = odd ? s : c, sin_mag = odd ? c : s;
    const I32x16 cos_neg = ((q + 1) & 2) != 0, sin_neg = (q & 2) != 0;
    const F32x16 cos_v = cos_neg ? -cos_mag : cos_mag, sin_v = sin_neg ? -sin_mag : sin_mag;

    const F32x16 first = r * cos_v * std, second = r * sin_v * std;
    std::memcpy(out, &first, sizeof first);
    std::memcpy(out + 16, &second, sizeof second);
  }
}

// Blocks b0 .. b0 + nb of the uniform stream into out: low + (high - low) u.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void uniform_blocks(
    uint64_t key, int64_t b0, int64_t nb, float low, float high, float* out) {
  const float width = high - low;
  for (int64_t b = b0; b < b0 + nb; ++b, out += kBlock) {
    TF_BLOCK_WORDS(key, b, hi, lo);
    const F32x16 first =
        __builtin_convertvector((I32x16)(hi >> 8), F32x16) * kTwoPow24 * width + low;
    const F32x16 second =
        __builtin_convertvector((I32x16)(lo >> 8), F32x16) * kTwoPow24 * width + low;
    std::memcpy(out, &first, sizeof first);
    std::memcpy(out + 16, &second, sizeof second);
  }
}

#undef TF_BLOCK_WORDS

// Values [first, first + n) from whole blocks: the blocks inside the range
// straight into out, a partial block at either end through a buffer.
template <typename Blocks>
void draw_range(int64_t first, int64_t n, float* out, const Blocks& blocks) {
  float buffer[kBlock];
  int64_t i = first;
  const int64_t end = first + n;
  while (i < end) {
    const int64_t b = i / kBlock, offset = i - b * kBlock;
    if (offset == 0 && end - i >= kBlock) {
      const int64_t whole = (end - i) / kBlock;
      blocks(b, whole, out + (i - first));
      i += whole * kBlock;
      continue;
    }
    blocks(b, 1, buffer);
    const int64_t take = std::min(kBlock - offset, end - i);
    std::memcpy(out + (i - first), buffer + offset, static_cast<size_t>(take) * sizeof(float));
    i += take;
  }
}

}  // namespace

uint64_t init_stream_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the name
  for (const unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ULL;
  return mix64(mix64(seed + kGamma) ^ h);
}

void draw_normal(uint64_t key, int64_t first, int64_t n, float std, float* out) {
  draw_range(first, n, out,
             [&](int64_t b, int64_t nb, float* dst) { normal_blocks(key, b, nb, std, dst); });
}

void draw_uniform(uint64_t key, int64_t first, int64_t n, float low, float high, float* out) {
  draw_range(first, n, out, [&](int64_t b, int64_t nb, float* dst) {
    uniform_blocks(key, b, nb, low, high, dst);
  });
}

}  // namespace tightfit
