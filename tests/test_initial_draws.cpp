// The initial values' streams (kernel/memory/initial_draws.hpp): any range is
// the same values as the whole, the vector code is the scalar IEEE
// computation bit for bit (so every CPU draws the same numbers), and the
// values are N(0, std) and U(low, high) by the usual tests.
// Compiled with -ffp-contract=off, as the code it checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "initial_draws.hpp"

using namespace tightfit;

namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Hash k of block b, by the header's description.
uint64_t block_hash(uint64_t key, int64_t b, int k) {
  return mix(key + static_cast<uint64_t>(16 * b + k + 1) * 0x9e3779b97f4a7c15ULL);
}

// Cephes' logf, one value, in the same operations as the header describes.
float cephes_log(float u) {
  int32_t bits;
  std::memcpy(&bits, &u, sizeof bits);
  int32_t e = ((bits >> 23) & 0xff) - 126;
  bits = (bits & 0x007fffff) | 0x3f000000;
  float m;
  std::memcpy(&m, &bits, sizeof m);
  float x = m - 1.0f;
  if (m < 0.707106781186547524f) {
    e -= 1;
    x = x + m;
  }
  const float fe = static_cast<float>(e), z = x * x;
  float y = 7.0376836292e-2f * x - 1.1514610310e-1f;
  for (const float c : {1.1676998740e-1f, -1.2420140846e-1f, 1.4249322787e-1f, -1.6668057665e-1f,
                        2.0000714765e-1f, -2.4999993993e-1f, 3.3333331174e-1f})
    y = y * x + c;
  y = y * x * z;
  y += fe * -2.12194440e-4f;
  y += z * -0.5f;
  return (x + y) + fe * 0.693359375f;
}

// Value i of the normal stream, one value at a time in scalar fp32.
float scalar_normal(uint64_t key, int64_t i, float std) {
  const int64_t b = i / 32, slot = i % 32;
  const uint64_t h = block_hash(key, b, static_cast<int>(slot % 16));
  const auto hi = static_cast<uint32_t>(h >> 32), lo = static_cast<uint32_t>(h);
  const float u1 = static_cast<float>((hi >> 8) + 1) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>(lo >> 8) * (1.0f / 16777216.0f);
  const float two_ln = cephes_log(u1) * -2.0f;
  const float r = std::sqrt(two_ln > 0.0f ? two_ln : 0.0f);
  const float turns = u2 * 4.0f;
  const int q = static_cast<int>(turns + 0.5f);
  const float a = (turns - static_cast<float>(q)) * 1.57079632679489661923f, aa = a * a;
  float s = -1.9515295891e-4f * aa + 8.3321608736e-3f;
  s = s * aa - 1.6666654611e-1f;
  s = a + a * aa * s;
  float c = 2.443315711809948e-5f * aa - 1.388731625493765e-3f;
  c = c * aa + 4.166664568298827e-2f;
  c = 1.0f - aa * 0.5f + aa * aa * c;
  const float cos_v = (q & 1) ? ((q + 1) & 2 ? -s : s) : ((q + 1) & 2 ? -c : c);
  const float sin_v = (q & 1) ? (q & 2 ? -c : c) : (q & 2 ? -s : s);
  return slot < 16 ? r * cos_v * std : r * sin_v * std;
}

std::vector<float> normal(uint64_t key, int64_t first, int64_t n, float std = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  draw_normal(key, first, n, std, v.data());
  return v;
}

}  // namespace

TEST(InitialDraws, AnyRangeIsTheSameValuesAsTheWhole) {
  const uint64_t key = init_stream_key(5, "layers.0.w");
  const std::vector<float> whole = normal(key, 0, 4000);
  for (const auto& [first, n] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 1}, {1, 30}, {31, 2}, {32, 32}, {7, 3000}, {33, 1}, {3999, 1}, {100, 1500}}) {
    const std::vector<float> part = normal(key, first, n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(part[static_cast<size_t>(i)], whole[static_cast<size_t>(first + i)])
          << "range " << first << "+" << n << " at " << i;
  }
  std::vector<float> u_whole(1000), u_part(100);
  draw_uniform(key, 0, 1000, -0.5f, 0.5f, u_whole.data());
  draw_uniform(key, 413, 100, -0.5f, 0.5f, u_part.data());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(u_part[static_cast<size_t>(i)], u_whole[413 + i]);
}

// The vector clone this CPU runs equals the scalar computation bit for bit:
// IEEE operations only, none fused, so the numbers are the same on a CPU
// with AVX-512, with AVX2 only, or neither.
TEST(InitialDraws, TheVectorCodeIsTheScalarComputationBitForBit) {
  for (const uint64_t seed : {uint64_t{0}, uint64_t{1234}, ~uint64_t{0}}) {
    const uint64_t key = init_stream_key(seed, "embed.weight");
    const std::vector<float> got = normal(key, 0, 1 << 16, 0.02f);
    for (int64_t i = 0; i < (1 << 16); ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], scalar_normal(key, i, 0.02f)) << "value " << i;
    std::vector<float> u(4096);
    draw_uniform(key, 64, 4096, -0.3f, 0.3f, u.data());
    for (int64_t i = 0; i < 4096; ++i) {
      const int64_t pos = 64 + i, b = pos / 32, slot = pos % 32;
      const uint64_t h = block_hash(key, b, static_cast<int>(slot % 16));
      const uint32_t word = slot < 16 ? static_cast<uint32_t>(h >> 32) : static_cast<uint32_t>(h);
      const float unit = static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
      ASSERT_EQ(u[static_cast<size_t>(i)], unit * 0.6f + -0.3f) << "value " << i;
    }
  }
}

// N(0, 1) by its moments, its mass within 1, 2 and 3 sigma, and
// Kolmogorov-Smirnov against the normal CDF (the 1% critical value); the
// two values of a Box-Muller pair uncorrelated.
TEST(InitialDraws, NormalValuesAreStandardNormal) {
  const int64_t n = int64_t{1} << 22;
  std::vector<float> v = normal(init_stream_key(99, "w"), 0, n);
  double sum = 0, sq = 0, pair = 0;
  int64_t in1 = 0, in2 = 0, in3 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = v[static_cast<size_t>(i)];
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sq += x * x;
    in1 += std::fabs(x) < 1;
    in2 += std::fabs(x) < 2;
    in3 += std::fabs(x) < 3;
    if (i % 32 < 16) pair += x * v[static_cast<size_t>(i + 16)];
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 4.0 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(var, 1.0, 3e-3);
  EXPECT_NEAR(pair / (n / 2), 0.0, 4e-3);
  EXPECT_NEAR(static_cast<double>(in1) / n, 0.682689, 2e-3);
  EXPECT_NEAR(static_cast<double>(in2) / n, 0.954500, 1e-3);
  EXPECT_NEAR(static_cast<double>(in3) / n, 0.997300, 3e-4);
  std::sort(v.begin(), v.end());
  double ks = 0;
  for (int64_t i = 0; i < n; i += 7) {
    const double cdf = 0.5 * std::erfc(-v[static_cast<size_t>(i)] / std::sqrt(2.0));
    ks = std::max({ks, std::fabs(cdf - static_cast<double>(i) / n),
                   std::fabs(cdf - static_cast<double>(i + 1) / n)});
  }
  EXPECT_LT(ks, 1.63 / std::sqrt(static_cast<double>(n)));
  EXPECT_NEAR(normal(init_stream_key(99, "w"), 0, 1 << 20, 0.02f)[12345],
              normal(init_stream_key(99, "w"), 0, 1 << 20)[12345] * 0.02f, 1e-9);
}

TEST(InitialDraws, UniformValuesAreUniform) {
  const int64_t n = int64_t{1} << 22;
  std::vector<float> u(static_cast<size_t>(n));
  draw_uniform(init_stream_key(3, "lora_A"), 0, n, -0.25f, 0.25f, u.data());
  double sum = 0, sq = 0;
  std::vector<int64_t> bins(20, 0);
  for (const float x : u) {
    ASSERT_GE(x, -0.25f);
    ASSERT_LE(x, 0.25f);
    sum += x;
    sq += static_cast<double>(x) * x;
    ++bins[std::min<size_t>(19, static_cast<size_t>((x + 0.25) / 0.5 * 20))];
  }
  EXPECT_NEAR(sum / n, 0.0, 4.0 * 0.25 / std::sqrt(3.0 * n));
  EXPECT_NEAR(sq / n, 0.25 * 0.25 / 3.0, 1e-4);
  double chi2 = 0;
  for (const int64_t b : bins) chi2 += std::pow(b - n / 20.0, 2) / (n / 20.0);
  EXPECT_LT(chi2, 43.8);  // 19 degrees of freedom, 0.1%
}

TEST(InitialDraws, KeysDifferBySeedAndName) {
  EXPECT_NE(init_stream_key(7, "w"), init_stream_key(8, "w"));
  EXPECT_NE(init_stream_key(7, "w"), init_stream_key(7, "w2"));
  EXPECT_NE(init_stream_key(7, "a.b"), init_stream_key(7, "a.c"));
  EXPECT_NE(normal(init_stream_key(7, "w"), 0, 64), normal(init_stream_key(8, "w"), 0, 64));
}
