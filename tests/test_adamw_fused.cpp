// [optimizer] fused = true: AdamW through LibTorch's fused kernel, as
// torch.optim.AdamW(fused=True) runs it, within a few last bits of the
// default multi-tensor update.
#include <gtest/gtest.h>

#include "optimizer.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

OptimizerConfig adamw(bool fused) {
  OptimizerConfig c;
  c.name = "adamw";
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.fused = fused;
  return c;
}

// Three parameters (the second does not decay), each with its own step
// count, updated three times from the same gradients.
struct Trial {
  std::vector<at::Tensor> values, m, v;
  std::vector<bool> decays{true, false, true};
  std::vector<int64_t> first_step{1, 3, 2};

  Trial() {
    at::manual_seed(11);
    for (const int64_t n : {300, 17, 4096}) {
      values.push_back(at::randn({n}));
      m.push_back(at::zeros({n}));
      v.push_back(at::zeros({n}));
    }
  }
  static at::Tensor grad(size_t i, int k) {
    at::manual_seed(100 + 10 * k + static_cast<int64_t>(i));
    return at::randn({i == 0 ? 300 : i == 1 ? 17 : 4096});
  }
  void run(Optimizer& o) {
    for (int k = 0; k < 3; ++k) {
      std::vector<Optimizer::Item> items;
      for (size_t i = 0; i < values.size(); ++i)
        items.push_back({values[i], decays[i], grad(i, k), {&m[i], &v[i]}, first_step[i] + k});
      o.update_many(items);
    }
  }
};

// What torch.optim.AdamW(fused=True) calls for a parameter group: the
// kernel on the group's tensors, the step counts as fp32 tensors already
// advanced, the group's weight decay.
TEST(FusedAdamw, IsTorchsFusedAdamWCallBitForBit) {
  Trial fused;
  Optimizer o(adamw(true));
  fused.run(o);
  EXPECT_GT(o.fused_launches(), 0);

  Trial ref;
  const OptimizerConfig c = adamw(true);
  for (int k = 0; k < 3; ++k)
    for (size_t i = 0; i < ref.values.size(); ++i) {
      std::vector<at::Tensor> step{at::full({}, static_cast<double>(ref.first_step[i] + k))};
      at::_fused_adamw_({ref.values[i]}, {Trial::grad(i, k)}, {ref.m[i]}, {ref.v[i]}, {}, step,
                        c.lr, c.beta1, c.beta2, ref.decays[i] ? c.weight_decay : 0.0, c.eps, false,
                        false);
    }
  for (size_t i = 0; i < ref.values.size(); ++i) {
    EXPECT_TRUE(at::equal(fused.values[i], ref.values[i])) << "parameter " << i;
    EXPECT_TRUE(at::equal(fused.m[i], ref.m[i])) << "exp_avg " << i;
    EXPECT_TRUE(at::equal(fused.v[i], ref.v[i])) << "exp_avg_sq " << i;
  }
}

// The largest difference of a and b, as a fraction of b's largest value.
double off(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / (b.abs().max().item<double>() + 1e-30);
}

// The stated rounding: the same update as the default multi-tensor path to
// a few parts in ten million of each tensor's scale after three steps, decay
// and step counts too (a wrong decay, step or learning rate is off by far
// more: 1e-2 of lr moves these values by 1e-4 of their scale).
TEST(FusedAdamw, WithinAFewLastBitsOfTheMultiTensorUpdate) {
  Trial fused, plain;
  Optimizer f(adamw(true)), p(adamw(false));
  fused.run(f);
  plain.run(p);
  EXPECT_EQ(p.fused_launches(), 0);
  for (size_t i = 0; i < plain.values.size(); ++i) {
    const at::Tensor start = Trial().values[i];
    EXPECT_GT(off(plain.values[i], start) + off(start, plain.values[i]), 1e-3) << i;
    EXPECT_LE(off(fused.values[i], plain.values[i]), 1e-6) << "parameter " << i;
    EXPECT_LE(off(fused.m[i], plain.m[i]), 1e-6) << "exp_avg " << i;
    EXPECT_LE(off(fused.v[i], plain.v[i]), 1e-6) << "exp_avg_sq " << i;
  }
}

class FusedAdamwRun : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(bool fused, const std::string& strategies = "") const {
    std::string r = test::tiny_recipe(corpus, dir.str() + (fused ? "/f" : "/p"), "", strategies);
    r.replace(r.find("lr = 1e-3"), 9,
              std::string("lr = 1e-3\nfused = ") + (fused ? "true" : "false"));
    return r;
  }
};

// A run trains the same with the key as without it, to the stated rounding,
// also with bf16 weights (updated through their fp32 working copies).
TEST_F(FusedAdamwRun, TrainsAsTheDefaultUpdateToItsRounding) {
  for (const std::string& stack :
       {std::string(), std::string("[[strategy]]\nplugin = \"precision\"\nmode = \"bf16\"\n")}) {
    auto plain = test::make_session(recipe(false, stack));
    auto fused = test::make_session(recipe(true, stack));
    const TrainSummary a = plain->train(), b = fused->train();
    ASSERT_EQ(a.losses.size(), b.losses.size());
    ASSERT_GE(a.losses.size(), 3u);
    for (size_t k = 0; k < a.losses.size(); ++k)
      EXPECT_NEAR(a.losses[k], b.losses[k], 1e-4 * std::abs(a.losses[k])) << stack << " step " << k;
    EXPECT_GT(fused->update().optimizer().fused_launches(), 0) << stack;
    EXPECT_EQ(plain->update().optimizer().fused_launches(), 0) << stack;
    // The trained weights' change from the start agrees to 0.1% (fp32;
    // the runs' gradients part after the first step, so rounding grows a
    // little each step), or to a bf16 rounding of the weight.
    auto start = test::make_session(recipe(false, stack));
    for (Param* p : plain->store().trainable()) {
      const at::Tensor w = p->value.detach().to(at::kFloat);
      const at::Tensor g = fused->store().get(p->name).value.detach().to(at::kFloat);
      const at::Tensor w0 = start->store().get(p->name).value.detach().to(at::kFloat);
      const double moved = (w - w0).abs().max().item<double>();
      const double bound =
          stack.empty() ? 1e-3 * moved : std::max(1e-3 * moved, w.abs().max().item<double>() / 128);
      if (stack.empty()) {  // (bf16 spacing at 1.0 is 2^-7: a norm's weight may not move)
        EXPECT_GT(moved, 0) << p->name;
      }
      EXPECT_LE((w - g).abs().max().item<double>(), bound) << p->name << " " << stack;
    }
  }
}

TEST_F(FusedAdamwRun, SgdWithTheKeyIsRefused) {
  std::string r = recipe(true);
  r.replace(r.find("lr = 1e-3"), 9, "name = \"sgd\"\nlr = 1e-3");
  try {
    test::make_session(r);
    FAIL() << "sgd with fused = true was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("fused = true"), std::string::npos) << e.what();
  }
}

// 8-bit AdamW updates every parameter itself: the key does nothing, and the
// run says so once instead of keeping quiet.
TEST_F(FusedAdamwRun, SaysWhenStrategiesUpdateEveryParameterThemselves) {
  SessionOptions o;
  std::vector<std::string> lines;
  o.on_log = [&](const std::string& l) { lines.push_back(l); };
  auto s = test::make_session(recipe(true, "[[strategy]]\nplugin = \"adamw8\"\n"), o);
  s->train();
  int said = 0;
  for (const std::string& l : lines)
    said += l.find("fused = true updates nothing") != std::string::npos;
  EXPECT_EQ(said, 1);
  EXPECT_EQ(s->update().optimizer().fused_launches(), 0);
}

}  // namespace
}  // namespace tightfit
