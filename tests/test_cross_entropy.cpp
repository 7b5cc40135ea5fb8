// The kernel's cross-entropy (blocked log-sum-exp, gradient written over the
// saved logits) against LibTorch's at::cross_entropy_loss: the same loss and
// the same gradients, whether or not it may overwrite the logits.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <utility>

#include "cross_entropy.hpp"

namespace tightfit {
namespace {

struct Grads {
  double loss;
  at::Tensor dh, dw;
};

// logits = f(h W^T) for a head matrix W, as a model's head makes them.
// `ignored`: every how-many-th target is kIgnoreIndex (0 = none). LibTorch's
// reference runs in double. The fp32 GEMM that makes the logits is not
// reproducible on a loaded machine: 1 run in 50 under ctest -j2 gave logits
// whose loss was 16 ulps off (on either side), gradients up to 1e-4 of their
// largest; that failed a fresh-clone CI. A mistake in the cross-entropy
// itself (a lost one-hot, a wrong scale, a softmax written over logits tanh
// keeps) is off by percents, so the comparison is against the gradients'
// scale: 1e-3 of the largest, and 1e-5 of the loss.
Grads run(bool ours, bool through_tanh, int64_t n, int64_t v, int64_t ignored = 0) {
  at::manual_seed(3);
  const at::Tensor h0 = at::randn({n, 32}), w0 = at::randn({v, 32}) * 0.3;
  at::Tensor t = at::randint(0, v, {n}, at::kLong);
  if (ignored > 0) t.index_put_({at::arange(0, n, ignored)}, kIgnoreIndex);
  const at::ScalarType dtype = ours ? at::kFloat : at::kDouble;
  at::Tensor h = h0.to(dtype).requires_grad_(true), w = w0.to(dtype).requires_grad_(true);
  at::Tensor logits = at::matmul(h, w.t());
  if (through_tanh) logits = at::tanh(logits);  // keeps its output for its backward
  at::Tensor loss = ours ? cross_entropy_mean(logits, t)
                         : at::cross_entropy_loss(logits, t, {}, at::Reduction::Mean, kIgnoreIndex);
  loss.backward();
  return {loss.item<double>(), h.grad().to(at::kFloat), w.grad().to(at::kFloat)};
}

void expect_same(const Grads& a, const Grads& b) {
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(b.loss));
  for (const auto& [x, y] : {std::pair{a.dh, b.dh}, std::pair{a.dw, b.dw}})
    EXPECT_LE((x - y).abs().max().item<double>(), 1e-3 * y.abs().max().item<double>())
        << (x - y).abs().max() << " of " << y.abs().max();
}

TEST(CrossEntropy, SameLossAndGradientsAsLibTorch) {
  expect_same(run(true, false, 64, 1000), run(false, false, 64, 1000));
}

// More rows than one block holds: the blocks cover every row once.
TEST(CrossEntropy, BlocksCoverEveryRow) {
  const int64_t v = 50000;
  ASSERT_LT(cross_entropy_block_rows(v), 100);
  expect_same(run(true, false, 100, v), run(false, false, 100, v));
}

// Logits from an op that keeps its output for backward must not be
// overwritten: tanh's gradient would read the softmax instead.
TEST(CrossEntropy, LeavesLogitsAnotherOpKeepsAlone) {
  expect_same(run(true, true, 64, 1000), run(false, true, 64, 1000));
}

// Prompt and padding targets (kIgnoreIndex) count nothing: the mean is over
// the others, and their rows get no gradient, as ignore_index in LibTorch.
TEST(CrossEntropy, IgnoredTargetsAsLibTorchIgnoreIndex) {
  expect_same(run(true, false, 64, 1000, 3), run(false, false, 64, 1000, 3));
  expect_same(run(true, false, 100, 50000, 2), run(false, false, 100, 50000, 2));
  expect_same(run(true, true, 64, 1000, 5), run(false, true, 64, 1000, 5));
  // Nothing counted: a zero loss and zero gradients, not NaN.
  at::Tensor logits = at::randn({4, 10}).requires_grad_(true);
  at::Tensor loss = cross_entropy_mean(logits * 1.0, at::full({4}, kIgnoreIndex, at::kLong));
  loss.backward();
  EXPECT_EQ(loss.item<double>(), 0.0);
  EXPECT_EQ(logits.grad().abs().sum().item<double>(), 0.0);
}

// In fp32 the two sum in different orders (and the CPU's vector width picks
// the exp/log kernels), so they agree to a few float ulps of the value, not
// to a fixed 1e-6 (a 3-ulp difference at 6.1 failed that once under load);
// in double the maths is the same to 1e-12.
TEST(CrossEntropy, WithoutGradientsTheSameValue) {
  at::NoGradGuard no_grad;
  const at::Tensor logits = at::randn({50, 300}), t = at::randint(0, 300, {50}, at::kLong);
  const double want = at::cross_entropy_loss(logits, t).item<double>();
  EXPECT_NEAR(cross_entropy_mean(logits, t).item<double>(), want,
              16 * std::numeric_limits<float>::epsilon() * std::abs(want));
  const at::Tensor wide = logits.to(at::kDouble);
  EXPECT_NEAR(cross_entropy_mean(wide, t).item<double>(),
              at::cross_entropy_loss(wide, t).item<double>(), 1e-12);
}

}  // namespace
}  // namespace tightfit
