// RMSNorm that keeps its 16-bit input for backward (tightfit/rms_norm.hpp):
// the reference's output and input gradient bit for bit (Llama's and
// Gemma's norms, frozen as under LoRA, backward a few rows at a time), for
// the input's bytes where autograd kept its fp32 copy; a trained weight
// keeps the reference's autograd.
#include <gtest/gtest.h>

#include "memory_accounting.hpp"
#include "tightfit/rms_norm.hpp"

namespace tightfit {
namespace {

struct NormCase {
  const char* name;
  bool unit_offset;
};

class RmsNormKeepingInput : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormKeepingInput, EqualsTheReferenceBitForBit) {
  const NormCase& c = GetParam();
  at::manual_seed(5);
  // 4,096 wide: backward takes 512 rows at a time, three pieces of these
  // 1,202 rows (the last one short).
  const at::Tensor x0 = (at::randn({2, 601, 4096}) * 3).to(at::kBFloat16);
  const at::Tensor w0 = (at::randn({4096}) * 0.1 + (c.unit_offset ? 0.0 : 1.0)).to(at::kBFloat16);
  const at::Tensor g = at::randn({2, 601, 4096}).to(at::kBFloat16);
  auto run = [&](bool keeping_input) {
    const at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor w = w0.clone();  // frozen, as under LoRA
    const at::Tensor y = keeping_input ? tf_sdk::rms_norm(x, w, 1e-6, c.unit_offset)
                                       : tf_sdk::rms_norm_reference(x, w, 1e-6, c.unit_offset);
    y.backward(g);
    return std::vector<at::Tensor>{y.detach(), x.grad()};
  };
  const auto want = run(false), got = run(true);
  EXPECT_EQ(got[0].scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(got[0], want[0])) << "output";
  EXPECT_TRUE(at::equal(got[1], want[1])) << "input's gradient";
}

INSTANTIATE_TEST_SUITE_P(Norms, RmsNormKeepingInput,
                         ::testing::Values(NormCase{"llama", false}, NormCase{"gemma", true}),
                         [](const auto& info) { return std::string(info.param.name); });

// What a forward keeps for backward: the reference keeps the fp32 copy of
// the bf16 input (4 bytes a value) and more; rms_norm only the input (held
// by its caller anyway here) and nothing of its own beyond a few bytes.
TEST(RmsNormKeepingInput, KeepsTheInputNotItsFp32Copy) {
  const at::Tensor x = at::randn({4, 256, 512}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor w = at::ones({512}).to(at::kBFloat16);
  auto& acct = MemoryAccounting::instance();
  auto kept = [&](bool keeping_input) {
    const int64_t before = acct.snapshot().total_current;
    at::Tensor y = keeping_input ? tf_sdk::rms_norm(x, w, 1e-5)
                                 : tf_sdk::rms_norm_reference(x, w, 1e-5, false);
    const int64_t held = acct.snapshot().total_current - before - y.nbytes();
    return held;
  };
  const int64_t reference = kept(false), keeping = kept(true);
  EXPECT_GE(reference, x.numel() * 4) << "the reference keeps the fp32 copy";
  EXPECT_LT(keeping, 4096) << "rms_norm keeps nothing of its own";
  // A trained weight: the reference's autograd, its fp32 copy kept.
  const at::Tensor trained = at::ones({512}).to(at::kBFloat16).requires_grad_(true);
  const int64_t before = acct.snapshot().total_current;
  at::Tensor y = tf_sdk::rms_norm(x, trained, 1e-5);
  EXPECT_GE(acct.snapshot().total_current - before - y.nbytes(), x.numel() * 4);
}

// Backward: the reference's fp32 gradients over every row at once (about
// six fp32 tensors the input's size, 2,048 x 4,096 here: 200 MiB) against a
// few rows at a time: less than half the peak above what the pass holds.
TEST(RmsNormKeepingInput, BackwardHoldsAFewRowsAtATime) {
  auto& acct = MemoryAccounting::instance();
  const at::Tensor w = at::ones({4096}).to(at::kBFloat16);
  auto backward_peak = [&](bool keeping_input) {
    const at::Tensor x = at::randn({1, 2048, 4096}).to(at::kBFloat16).requires_grad_(true);
    const at::Tensor g = at::randn({1, 2048, 4096}).to(at::kBFloat16);
    at::Tensor y = keeping_input ? tf_sdk::rms_norm(x, w, 1e-5)
                                 : tf_sdk::rms_norm_reference(x, w, 1e-5, false);
    const int64_t before = acct.snapshot().total_current;
    acct.reset_peaks();
    y.backward(g);
    EXPECT_TRUE(x.grad().defined());
    return acct.snapshot().total_peak - before;
  };
  const int64_t reference = backward_peak(false), keeping = backward_peak(true);
  EXPECT_LT(keeping * 2, reference)
      << "rows at a time " << keeping << ", all at once " << reference;
}

}  // namespace
}  // namespace tightfit
