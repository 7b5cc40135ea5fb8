// The MeZO schedule: its projected gradient is the directional derivative
// along a Gaussian direction, it trains with forward passes only (no
// gradients, no optimizer state), and it resumes exactly.
#include <gtest/gtest.h>

#include "test_support.hpp"

namespace tightfit {
namespace {

class MezoTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& out, int steps, const std::string& schedule_extra = "") {
    std::string r = test::tiny_recipe(corpus, out);
    r.replace(r.find("steps = 4"), 9, "steps = " + std::to_string(steps));
    r.replace(
        r.find("[schedule]\nplugin = \"standard\"\nwarmup_steps = 2\n"),
        std::string("[schedule]\nplugin = \"standard\"\nwarmup_steps = 2\n").size(),
        "[schedule]\nplugin = \"mezo\"\nwarmup_steps = 0\ndecay = \"constant\"\n" + schedule_extra);
    return r;
  }
};

std::map<std::string, at::Tensor> weights(Session& s) {
  std::map<std::string, at::Tensor> out;
  for (Param* p : s.store().trainable()) out[p->name] = p->value.detach().clone();
  return out;
}

// One step moves theta by -lr * g * z: z (recovered from the move) is
// standard normal, and g * z . grad L = the move's slope, i.e. g = z . grad L
// (a central difference, exact to O(eps^2)).
TEST_F(MezoTest, ProjectedGradientIsTheDirectionalDerivative) {
  const double lr = 1e-3;
  // A small eps: the perturbation's norm is eps * sqrt(#params), and the
  // central difference's error grows with its cube.
  auto s = test::make_session(recipe((dir.path() / "a").string(), 1, "eps = 1e-4\n"));
  // The gradient on the batch the step will use (the first).
  const auto b = s->data().batcher().next();
  s->data().batcher().set_position(0);
  s->update().zero_grad();
  s->executor().run_pass(b.tokens, b.targets, true, 1.0);
  std::map<std::string, at::Tensor> grad;
  for (Param* p : s->store().trainable()) grad[p->name] = p->value.grad().clone();
  s->update().zero_grad();
  const auto before = weights(*s);
  s->train();
  const double g = s->step_metrics().at("mezo.projected_grad");
  ASSERT_TRUE(std::isfinite(g));
  ASSERT_GT(std::abs(g), 1e-3);
  double dot = 0, n = 0, sum = 0, sum_sq = 0;
  for (const auto& [name, w] : weights(*s)) {
    const at::Tensor z = (w - before.at(name)) / (-lr * g);
    dot += (z * grad.at(name)).sum().item<double>();
    n += static_cast<double>(z.numel());
    sum += z.sum().item<double>();
    sum_sq += z.square().sum().item<double>();
  }
  EXPECT_NEAR(dot / g, 1.0, 0.02) << "z . grad = " << dot << ", projected gradient " << g;
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sum_sq / n), 1.0, 0.02);
}

TEST_F(MezoTest, TrainsOnForwardPassesOnly) {
  std::string r = recipe((dir.path() / "b").string(), 200);
  r.replace(r.find("lr = 1e-3"), 9, "lr = 5e-3");
  auto s = test::make_session(r);
  const TrainSummary sum = s->train();
  ASSERT_EQ(sum.losses.size(), 200u);
  EXPECT_EQ(sum.backward_passes, 0);
  double head = 0, tail = 0;
  for (size_t i = 0; i < 20; ++i) {
    head += sum.losses[i] / 20;
    tail += sum.losses[sum.losses.size() - 1 - i] / 20;
  }
  EXPECT_LT(tail, head - 0.1) << head << " -> " << tail;
  EXPECT_EQ(sum.memory.peak[TF_MEM_GRADS], 0);
  EXPECT_EQ(sum.memory.peak[TF_MEM_OPTIMIZER], 0);
  EXPECT_TRUE(s->update().optimizer().state().empty());
}

TEST_F(MezoTest, ResumesExactly) {
  const std::string out = (dir.path() / "c").string();
  auto run = [&](const std::string& where, bool resume, int64_t stop) {
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop;
    return test::make_session(recipe(where, 12), o)->train();
  };
  const TrainSummary full = run(out + "/full", false, -1);
  run(out + "/split", false, 5);
  const TrainSummary rest = run(out + "/split", true, -1);
  ASSERT_EQ(rest.losses.size(), 7u);
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(rest.losses[i], full.losses[5 + i]) << i;
}

}  // namespace
}  // namespace tightfit
