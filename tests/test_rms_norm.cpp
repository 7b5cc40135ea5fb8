// RMSNorm that keeps its 16-bit input for backward (tightfit/rms_norm.hpp):
// the reference's output and gradients bit for bit (Llama's and Gemma's
// norms, trained and frozen weights), for the input's bytes where autograd
// kept its fp32 copy.
#include <gtest/gtest.h>

#include "memory_accounting.hpp"
#include "tightfit/rms_norm.hpp"

namespace tightfit {
namespace {

struct NormCase {
  const char* name;
  bool unit_offset;
  bool trained_weight;
};

class RmsNormKeepingInput : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormKeepingInput, EqualsTheReferenceBitForBit) {
  const NormCase& c = GetParam();
  at::manual_seed(5);
  const at::Tensor x0 = (at::randn({2, 37, 96}) * 3).to(at::kBFloat16);
  const at::Tensor w0 = (at::randn({96}) * 0.1 + (c.unit_offset ? 0.0 : 1.0)).to(at::kBFloat16);
  const at::Tensor g = at::randn({2, 37, 96}).to(at::kBFloat16);
  auto run = [&](bool keeping_input) {
    const at::Tensor x = x0.clone().requires_grad_(true);
    const at::Tensor w = w0.clone().requires_grad_(c.trained_weight);
    const at::Tensor y = keeping_input ? tf_sdk::rms_norm(x, w, 1e-6, c.unit_offset)
                                       : tf_sdk::rms_norm_reference(x, w, 1e-6, c.unit_offset);
    y.backward(g);
    return std::vector<at::Tensor>{y.detach(), x.grad(),
                                   c.trained_weight ? w.grad() : at::zeros({1})};
  };
  const auto want = run(false), got = run(true);
  EXPECT_EQ(got[0].scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(got[0], want[0])) << "output";
  EXPECT_TRUE(at::equal(got[1], want[1])) << "input's gradient";
  EXPECT_TRUE(at::equal(got[2], want[2])) << "weight's gradient";
}

INSTANTIATE_TEST_SUITE_P(Norms, RmsNormKeepingInput,
                         ::testing::Values(NormCase{"llama_frozen", false, false},
                                           NormCase{"llama_trained", false, true},
                                           NormCase{"gemma_frozen", true, false},
                                           NormCase{"gemma_trained", true, true}),
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
}

}  // namespace
}  // namespace tightfit
