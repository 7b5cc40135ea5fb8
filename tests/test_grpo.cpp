// GRPO's maths (plugins/sdk/tightfit/rl/grpo_loss.hpp) against TRL 0.24's
// GRPOTrainer: the group advantages for each scale_rewards, and the loss,
// its gradient with respect to the policy's per-token log-probabilities and
// the metrics TRL logs (kl, clip ratios) for each loss type, token and
// sequence importance weights (GSPO), with and without the KL term, old
// log-probs from another iteration or this pass's, and two-sided clipping.
// The peer runs GRPOTrainer._compute_loss itself on the same log-probs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "file_util.hpp"
#include "safetensors.hpp"
#include "test_support.hpp"
#include "tightfit/rl/grpo_loss.hpp"

namespace tightfit {
namespace {

struct Case {
  std::string name, loss_type, level = "token", scale_rewards = "group";
  double beta = 0.0;
  bool old = true;  // log-probs of the model that sampled (else this pass's)
  double epsilon_high = 0.28;
  std::optional<double> delta;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << c.name;
}

class GrpoParity : public testing::TestWithParam<Case> {};

TEST_P(GrpoParity, AdvantagesLossGradientAndMetricsEqualTrl) {
  const Case& c = GetParam();
  constexpr int64_t kPrompts = 3, kGroup = 4, kRows = kPrompts * kGroup, kWidth = 7;
  at::manual_seed(5);
  // Completions of different lengths (one empty), rewards with a group whose
  // rewards are all equal (zero deviation), log-probs of a policy that moved.
  at::Tensor mask = at::zeros({kRows, kWidth});
  for (int64_t r = 0; r < kRows; ++r) mask[r].narrow(0, 0, (r * 5) % (kWidth + 1)).fill_(1);
  at::Tensor rewards = at::randn({kRows});
  rewards.narrow(0, kGroup, kGroup).fill_(0.5);
  const at::Tensor logps = -at::rand({kRows, kWidth}) * 3;
  // Each completion's ratio drifts as a whole too, so that a sequence's
  // mean ratio (GSPO) leaves the clip range as a token's does.
  const at::Tensor old = logps + at::randn({kRows, kWidth}) * 0.3 + at::randn({kRows, 1}) * 0.4;
  const at::Tensor ref = logps + at::randn({kRows, kWidth}) * 0.2;

  tf_rl::GrpoOptions o;
  o.loss_type = tf_rl::loss_type_named(c.loss_type);
  o.level = tf_rl::importance_level_named(c.level);
  o.epsilon_low = 0.2;
  o.epsilon_high = c.epsilon_high;
  o.delta = c.delta;
  o.beta = c.beta;
  o.max_completion_length = kWidth + 3;
  o.accumulation_steps = 2;
  o.tokens_in_update = 2 * mask.sum().item<double>();

  test::TempDir d;
  std::map<std::string, at::Tensor> inputs = {
      {"logps", logps}, {"mask", mask}, {"rewards", rewards}};
  if (c.old) inputs["old"] = old;
  if (c.beta != 0) inputs["ref"] = ref;
  write_safetensors(d.str() + "/inputs.safetensors", inputs);
  nlohmann::json options = {{"loss_type", c.loss_type},
                            {"importance_sampling_level", c.level},
                            {"epsilon", o.epsilon_low},
                            {"epsilon_high", o.epsilon_high},
                            {"beta", c.beta},
                            {"max_completion_length", o.max_completion_length},
                            {"accumulation_steps", o.accumulation_steps},
                            {"tokens_in_update", o.tokens_in_update},
                            {"num_generations", kGroup},
                            {"scale_rewards", c.scale_rewards}};
  if (c.delta) options["delta"] = *c.delta;
  std::ofstream(d.str() + "/options.json") << options.dump();
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                          "/tests/peers/grpo_loss_parity.py " + d.str() + " > " + d.str() +
                          "/peer.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file_text(d.str() + "/peer.log");
  const auto want = read_safetensors(d.str() + "/expected.safetensors").tensors;

  const tf_rl::Advantages a =
      tf_rl::group_advantages(rewards, kGroup, tf_rl::scale_rewards_named(c.scale_rewards));
  EXPECT_TRUE(at::allclose(a.advantages, want.at("advantages"), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(a.std, want.at("group_std"), 1e-5, 1e-6));
  EXPECT_TRUE(at::equal(a.std_is_zero.to(at::kFloat), want.at("std_is_zero")));
  if (c.scale_rewards == "group") {
    EXPECT_TRUE(a.std_is_zero[kGroup].item<bool>());
  }

  const at::Tensor policy = logps.clone().requires_grad_(true);
  const tf_rl::GrpoLoss got =
      tf_rl::grpo_loss(policy, c.old ? old : at::Tensor(), c.beta != 0 ? ref : at::Tensor(),
                       want.at("advantages"), mask, o);
  got.loss.backward();
  const double loss = want.at("loss").item<double>();
  EXPECT_NEAR(got.loss.item<double>(), loss, 1e-6 * std::max(1.0, std::abs(loss)));
  EXPECT_TRUE(at::allclose(policy.grad(), want.at("grad"), 1e-5, 1e-7))
      << (policy.grad() - want.at("grad")).abs().max();
  EXPECT_GT(policy.grad().abs().sum().item<double>(), 0);
  auto metric = [&](const std::string& name) { return want.at("metric." + name).item<double>(); };
  if (c.beta != 0) {
    EXPECT_NEAR(got.kl, metric("kl"), 1e-6);
  } else {
    EXPECT_TRUE(std::isnan(got.kl));
    EXPECT_EQ(want.count("metric.kl"), 0u);
  }
  EXPECT_NEAR(got.clip_low, metric("clip_ratio/low_mean"), 1e-6);
  EXPECT_NEAR(got.clip_high, metric("clip_ratio/high_mean"), 1e-6);
  EXPECT_NEAR(got.clip_region, metric("clip_ratio/region_mean"), 1e-6);
  if (c.old) {
    EXPECT_GT(got.clip_region, 0);  // the clipping is exercised
  }
}

INSTANTIATE_TEST_SUITE_P(
    LossTypes, GrpoParity,
    testing::Values(Case{"grpo", "grpo"}, Case{"bnpo_kl", "bnpo", "token", "batch", 0.04},
                    Case{"dr_grpo", "dr_grpo", "token", "none"},
                    Case{"dapo_kl", "dapo", "token", "group", 0.04},
                    Case{"gspo", "grpo", "sequence", "group", 0.0},
                    Case{"gspo_dapo_kl", "dapo", "sequence", "batch", 0.04},
                    Case{"one_iteration", "dapo", "token", "group", 0.04, false},
                    Case{"two_sided", "bnpo", "token", "group", 0.0, true, 0.28, 1.5}),
    [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

// What TRL refuses by name is refused here too, by name.
TEST(GrpoLoss, RefusesWhatItCannotCompute) {
  EXPECT_THROW(tf_rl::loss_type_named("ppo"), std::invalid_argument);
  EXPECT_THROW(tf_rl::importance_level_named("row"), std::invalid_argument);
  EXPECT_THROW(tf_rl::scale_rewards_named("std"), std::invalid_argument);
  EXPECT_THROW(tf_rl::group_advantages(at::zeros({5}), 2, tf_rl::ScaleRewards::kGroup),
               std::invalid_argument);
  tf_rl::GrpoOptions o;
  o.beta = 0.1;
  const at::Tensor x = at::zeros({2, 3});
  EXPECT_THROW(tf_rl::grpo_loss(x, {}, {}, at::zeros({2}), at::ones({2, 3}), o),
               std::invalid_argument);
  o.beta = 0;
  o.loss_type = tf_rl::LossType::kDapo;
  EXPECT_THROW(tf_rl::grpo_loss(x, {}, {}, at::zeros({2}), at::ones({2, 3}), o),
               std::invalid_argument);
}

}  // namespace
}  // namespace tightfit
