#include "rope.hpp"

#include <algorithm>
#include <cmath>

namespace llama {
namespace {

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

Rope yarn(const Shape& s, const at::Tensor& pos_freqs, int64_t dim) {
  const double factor = s.rope_factor, base = s.rope_theta;
  Rope r;
  r.attention_scaling =
      s.yarn_attention_factor > 0 ? s.yarn_attention_factor
      : (s.yarn_mscale != 0 && s.yarn_mscale_all_dim != 0)
          ? yarn_mscale(factor, s.yarn_mscale) / yarn_mscale(factor, s.yarn_mscale_all_dim)
          : yarn_mscale(factor, 1.0);
  // The dimension at which a wavelength makes `rotations` turns over the original context.
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) *
           std::log(static_cast<double>(s.rope_original_max_positions) / (rotations * 2 * M_PI)) /
           (2 * std::log(base));
  };
  double low = correction_dim(s.yarn_beta_fast), high = correction_dim(s.yarn_beta_slow);
  if (s.yarn_truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // no singular ramp
  at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  at::Tensor extrapolation = 1 - ramp;  // 1 where frequencies stay as trained
  at::Tensor inv_extra = 1.0 / pos_freqs, inv_inter = 1.0 / (factor * pos_freqs);
  r.inv_freq = inv_inter * (1 - extrapolation) + inv_extra * extrapolation;
  return r;
}

at::Tensor llama3(const Shape& s, const at::Tensor& inv) {
  const double old_ctx = static_cast<double>(s.rope_original_max_positions);
  const double low_wavelen = old_ctx / s.rope_low_freq_factor,
               high_wavelen = old_ctx / s.rope_high_freq_factor;
  at::Tensor wavelen = 2.0 * M_PI / inv;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv / s.rope_factor, inv);
  at::Tensor smooth = (old_ctx / wavelen - s.rope_low_freq_factor) /
                      (s.rope_high_freq_factor - s.rope_low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / s.rope_factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

Rope longrope(const Shape& s, const at::Tensor& pos_freqs) {
  Rope r;
  auto divisors = [](const std::vector<double>& f) {
    return at::tensor(std::vector<float>(f.begin(), f.end()), at::kFloat);
  };
  r.inv_freq = 1.0 / (divisors(s.longrope_short) * pos_freqs);
  r.inv_freq_long = 1.0 / (divisors(s.longrope_long) * pos_freqs);
  r.long_after = s.rope_original_max_positions;
  const double original = static_cast<double>(s.rope_original_max_positions);
  const double factor = static_cast<double>(s.max_positions) / original;
  r.attention_scaling = factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(original));
  return r;
}

}  // namespace

Rope make_rope(const Shape& s) {
  const int64_t dim = s.rotary_dim();
  // base ** (2i / dim), in fp32 as the reference computes it.
  at::Tensor pos_freqs = at::pow(
      s.rope_theta, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim));
  if (s.rope_scaling == "yarn") return yarn(s, pos_freqs, dim);
  if (s.rope_scaling == "longrope") return longrope(s, pos_freqs);
  Rope r;
  r.inv_freq = 1.0 / pos_freqs;
  if (s.rope_scaling == "linear") r.inv_freq = r.inv_freq / s.rope_factor;
  if (s.rope_scaling == "llama3") r.inv_freq = llama3(s, r.inv_freq);
  return r;
}

}  // namespace llama
