// LoRA and quantize: adapters train while the base stays frozen; int8 and NF4
// storage round-trip within their bounds and shrink the weights; QLoRA trains
// and resumes exactly; bad combinations are recipe errors.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <regex>
#include <utility>

#include "nf4_codec.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

// The 16 NormalFloat4 levels as bitsandbytes publishes them (Dettmers et al.
// 2023), pinned at a few places by Nf4Codec.LevelsAreBitsandbytes.
const std::vector<float> kNf4(nf4::kLevels.begin(), nf4::kLevels.end());

class QloraTest : public ::testing::Test {
 public:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& strategies, const std::string& out = "") const {
    std::string r = test::tiny_recipe(corpus, out.empty() ? dir.str() : out, "", strategies);
    const auto begin = r.find("[model]"), end = r.find("[data]");
    r.replace(begin, end - begin,
              "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 64\nn_head "
              "= 4\nn_kv_head = 2\n"
              "intermediate_size = 128\nmax_positions = 64\n\n");
    return r;
  }
  static std::string lora(const std::string& targets = "[\"q\", \"v\", \"down\"]") {
    return "[[strategy]]\nplugin = \"lora\"\ntargets = " + targets + "\nrank = 4\nalpha = 8.0\n";
  }
  static std::string quant(const std::string& format, bool dq = true) {
    return "[[strategy]]\nplugin = \"quantize\"\nformat = \"" + format +
           "\"\ndouble_quant = " + (dq ? "true" : "false") + "\n";
  }
};

TEST_F(QloraTest, LoraStartsAsTheBaseAndTrainsOnlyAdapters) {
  auto plain = test::make_session(recipe(""));
  auto s = test::make_session(recipe(lora()));
  EXPECT_NE(s->store().find("model.layers.1.self_attn.q_proj.lora_A.weight"), nullptr);
  EXPECT_NE(s->store().find("model.layers.0.mlp.down_proj.lora_B.weight"), nullptr);
  EXPECT_EQ(s->store().find("model.layers.0.self_attn.k_proj.lora_A.weight"), nullptr);
  EXPECT_EQ(s->store().trainable().size(), 2u * 3u * 2u);  // 2 layers x 3 targets x (A, B)
  const at::Tensor tokens = at::randint(0, 256, {2, 16}, at::kLong);
  {
    at::NoGradGuard no_grad;  // B = 0: the adapted model is the base model
    EXPECT_TRUE(at::equal(s->executor().forward_logits(tokens, false),
                          plain->executor().forward_logits(tokens, false)));
  }
  const at::Tensor base_before =
      s->store().get("model.layers.0.self_attn.q_proj.weight").value.clone();
  auto batch = s->data().batcher().next();
  s->update().optimizer().set_lr(1e-2);
  double first = 0, last = 0;
  for (int i = 0; i < 25; ++i) {
    s->update().zero_grad();
    last = s->executor().run_pass(batch.tokens, batch.targets, true, 1.0).loss;
    if (i == 0) first = last;
    ASSERT_EQ(s->update().optimizer_step(), TF_OK);
  }
  EXPECT_LT(last, first - 0.3) << first << " -> " << last;
  EXPECT_TRUE(
      at::equal(s->store().get("model.layers.0.self_attn.q_proj.weight").value, base_before));
  EXPECT_GT(s->store()
                .get("model.layers.0.self_attn.q_proj.lora_B.weight")
                .value.abs()
                .max()
                .item<double>(),
            0);
}

TEST_F(QloraTest, Int8RoundTripMatchesReference) {
  auto plain = test::make_session(recipe(""));
  auto s = test::make_session(recipe(lora() + quant("int8")));
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  EXPECT_EQ(s->store().get(name).format, TF_FORMAT_INT8);
  const at::Tensor w = plain->store().get(name).value.detach();
  const at::Tensor absmax = w.abs().amax(1, true);
  const at::Tensor reference = (w / absmax * 127).round() * (absmax / 127);
  const at::Tensor got = s->executor().fetch_weight(name);
  EXPECT_LE((got - reference).abs().max().item<double>(), 1e-6);
  EXPECT_TRUE(((got - w).abs() <= absmax / 254 * (1 + 1e-5) + 1e-8).all().item<bool>());
}

TEST_F(QloraTest, Nf4RoundTripMatchesReferenceAndBound) {
  auto plain = test::make_session(recipe(""));
  const std::string name = "model.layers.0.mlp.gate_proj.weight";
  const at::Tensor w = plain->store().get(name).value.detach();
  // Reference: nearest NormalFloat4 level of w / absmax, per block of 64.
  const at::Tensor levels = at::tensor(kNf4).to(w.device());
  const at::Tensor blocks = w.flatten().view({-1, 64});
  const at::Tensor absmax = blocks.abs().amax(1, true);
  const at::Tensor codes = (blocks / absmax).unsqueeze(-1).sub(levels).abs().argmin(-1);
  const at::Tensor reference =
      (levels.index_select(0, codes.flatten()).view_as(blocks) * absmax).view_as(w);
  {
    auto s = test::make_session(recipe(lora() + quant("nf4", false)));
    EXPECT_EQ(s->store().get(name).format, TF_FORMAT_NF4);
    EXPECT_LE((s->executor().fetch_weight(name) - reference).abs().max().item<double>(), 1e-6);
  }
  auto s = test::make_session(recipe(lora() + quant("nf4", true)));
  const at::Tensor got = s->executor().fetch_weight(name);
  // Double quantization moves each block's absmax by at most half an int8 step of its group.
  const at::Tensor dev = (absmax - absmax.mean()).abs().max();
  const double absmax_err = dev.item<double>() / 254 * (1 + 1e-5);
  EXPECT_LE((got - reference).abs().max().item<double>(), absmax_err + 1e-6);
  double max_gap = 0;
  for (size_t i = 1; i < kNf4.size(); ++i)
    max_gap = std::max(max_gap, static_cast<double>(kNf4[i] - kNf4[i - 1]));
  EXPECT_TRUE(((got - w).abs().view({-1, 64}) <= absmax * (max_gap / 2) + absmax_err + 1e-6)
                  .all()
                  .item<bool>());
}

// Dequantization (one pass over the codes on the CPU, a chunk of 2^20 values
// at a time elsewhere): a weight of 2.1M values (its length no multiple of a
// block) comes back bit for bit as the whole-matrix reference gives it, in
// the model's dtype.
TEST_F(QloraTest, Nf4DequantizesAcrossChunksAsAWhole) {
  auto wide = [&](const std::string& strategies, const std::string& dtype) {
    std::string r = recipe(strategies);
    r.replace(r.find("n_layer = 2"), 11, "n_layer = 1");
    r.replace(r.find("n_embd = 64"), 11, "n_embd = 1000");
    r.replace(r.find("intermediate_size = 128"), 23, "intermediate_size = 2100");
    return r.replace(r.find("[data]"), 6, "dtype = \"" + dtype + "\"\n[data]");
  };
  const std::string name = "model.layers.0.mlp.gate_proj.weight";
  // An odd block size starts every other block in the middle of a byte.
  for (const auto& [dtype, block] :
       {std::pair<std::string, int64_t>{"fp32", 64}, {"bf16", 64}, {"fp32", 63}}) {
    auto plain = test::make_session(wide("", dtype));
    const at::Tensor w = plain->store().get(name).value.detach().to(at::kFloat);
    ASSERT_EQ(w.numel(), 2100 * 1000);
    const int64_t pad = (block - w.numel() % block) % block;
    ASSERT_NE(pad, 0);
    const at::Tensor blocks = at::constant_pad_nd(w.flatten(), {0, pad}).view({-1, block});
    const at::Tensor absmax = blocks.abs().amax(1, true).clamp_min(1e-12);
    const at::Tensor levels = at::tensor(kNf4).to(w.device());
    // Each quotient's level: the midpoints between levels it lies above, a
    // quotient on a midpoint going to the lower level (bitsandbytes' `>`
    // tree). The nearest level by distance is not that rule: both distances
    // round, and a quotient on a midpoint can come out nearer the upper one.
    const at::Tensor midpoints = (levels.slice(0, 1) + levels.slice(0, 0, -1)) / 2;
    const at::Tensor codes = at::bucketize(blocks / absmax, midpoints);
    const at::Tensor reference = (levels.index_select(0, codes.flatten()).view_as(blocks) * absmax)
                                     .flatten()
                                     .slice(0, 0, w.numel())
                                     .view_as(w);
    auto s = test::make_session(
        wide(lora() + quant("nf4", false) + "block_size = " + std::to_string(block) + "\n", dtype));
    const at::Tensor got = s->executor().fetch_weight(name);
    EXPECT_EQ(got.scalar_type(), dtype == "fp32" ? at::kFloat : at::kBFloat16);
    EXPECT_TRUE(at::equal(got, reference.to(got.scalar_type()))) << dtype << " " << block;
  }
}

TEST(Nf4Codec, LevelsAreBitsandbytes) {
  ASSERT_EQ(kNf4.size(), 16u);
  EXPECT_EQ(kNf4[0], -1.0f);
  EXPECT_EQ(kNf4[1], -0.6961928009986877f);
  EXPECT_EQ(kNf4[7], 0.0f);
  EXPECT_EQ(kNf4[8], 0.07958029955625534f);
  EXPECT_EQ(kNf4[14], 0.7229568362236023f);
  EXPECT_EQ(kNf4[15], 1.0f);
  EXPECT_TRUE(std::is_sorted(kNf4.begin(), kNf4.end()));
}

// The CPU's one-pass loops give the codes, absmaxes and values the tensor
// ops give (the path other devices take), bit for bit: fp32 and bf16
// weights, even and odd block sizes (64 and 32 take the AVX-512 permutes on a
// CPU that has them), a length no multiple of a block, an all-zero block,
// values exactly on the midpoints between levels (ties go to the lower
// level), and a NaN.
TEST(Nf4Codec, CpuLoopsMatchTheTensorOpsBitForBit) {
  at::manual_seed(7);
  const int64_t n = 100003;
  at::Tensor w = at::randn({n}, at::kFloat);
  w.slice(0, 640, 704).zero_();  // block 10 (of 64) all zero
  // Block 20: absmax 1 and every midpoint, each just below and above.
  std::vector<float> edge{1.0f};
  for (size_t k = 0; k + 1 < kNf4.size(); ++k) {
    const float m = (kNf4[k + 1] + kNf4[k]) / 2.0f;
    edge.insert(edge.end(), {m, std::nextafter(m, -2.0f), std::nextafter(m, 2.0f)});
  }
  w.slice(0, 1280, 1280 + static_cast<int64_t>(edge.size())).copy_(at::tensor(edge));
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (const int64_t block : {64, 63, 32, 2}) {
      at::Tensor x = w.to(dtype);
      if (dtype == at::kFloat && (block == 63 || block == 64)) x[5000] = std::nanf("");
      const auto [packed, absmax] = nf4::encode(x, block);
      const auto [ref_packed, ref_absmax] = nf4::encode_with_tensor_ops(x, block);
      const std::string where =
          std::string(c10::toString(dtype)) + " block " + std::to_string(block);
      ASSERT_TRUE(at::equal(packed, ref_packed)) << where;
      ASSERT_TRUE(at::equal(absmax.isnan(), ref_absmax.isnan())) << where;
      ASSERT_TRUE(at::equal(absmax.nan_to_num(0), ref_absmax.nan_to_num(0))) << where;
      for (const at::ScalarType out : {at::kFloat, at::kBFloat16, at::kHalf}) {
        const at::Tensor got = nf4::decode(packed, absmax, n, block, out);
        const at::Tensor ref = nf4::decode_with_tensor_ops(packed, absmax, n, block, out);
        ASSERT_EQ(got.scalar_type(), out);
        EXPECT_TRUE(at::equal(got.isnan(), ref.isnan())) << where;
        EXPECT_TRUE(at::equal(got.nan_to_num(0), ref.nan_to_num(0))) << where << " to " << out;
      }
    }
}

// Same adapters over (a) NF4 storage through the kernel's compact linear and
// (b) dense copies of the dequantized weights through the ordinary linear,
// with `extra` strategies after both.
void expect_compact_gradients_equal_dense(QloraTest& t, const std::string& extra) {
  const std::string targets = "[\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]";
  auto q = test::make_session(t.recipe(QloraTest::lora(targets) + QloraTest::quant("nf4") + extra));
  auto d = test::make_session(t.recipe(QloraTest::lora(targets) + extra));
  {
    at::NoGradGuard no_grad;
    for (Param& p : d->store().all()) {
      const Param& src = q->store().get(p.name);
      p.value.copy_(src.format == TF_FORMAT_DENSE ? src.value : q->executor().fetch_weight(p.name));
      if (p.flags & TF_PARAM_ADAPTER)
        p.value.normal_(0, 0.05), const_cast<Param&>(src).value.copy_(p.value);
    }
  }
  auto batch = q->data().batcher().next();
  const double lq = q->executor().run_pass(batch.tokens, batch.targets, true, 1.0).loss;
  const double ld = d->executor().run_pass(batch.tokens, batch.targets, true, 1.0).loss;
  EXPECT_NEAR(lq, ld, 1e-6);
  for (Param* p : d->store().trainable()) {
    const at::Tensor& gd = p->value.grad();
    const at::Tensor& gq = q->store().get(p->name).value.grad();
    ASSERT_TRUE(gd.defined() && gq.defined()) << p->name;
    EXPECT_LE((gq - gd).abs().max().item<double>() / (gd.abs().max().item<double>() + 1e-12), 1e-5)
        << p->name;
  }
}

TEST_F(QloraTest, CompactLinearGivesTheGradientsOfTheDequantizedWeights) {
  expect_compact_gradients_equal_dense(*this, "");
}

// Under autocast an NF4 weight is decoded straight to bf16 (forward, and the
// backward's fetch in the gradient's dtype), which is the cast of its fp32
// values: the step equals the dense run's whose fp32 weights autocast casts.
TEST_F(QloraTest, UnderAutocastTheCompactWeightIsServedInTheAutocastDtype) {
  const std::string autocast = "[[strategy]]\nplugin = \"precision\"\nmode = \"autocast\"\n";
  expect_compact_gradients_equal_dense(*this, autocast);
  auto s = test::make_session(recipe(lora() + quant("nf4") + autocast));
  const std::string name = "model.layers.0.mlp.gate_proj.weight";
  const at::Tensor fp32 = s->executor().fetch_weight(name);
  ASSERT_EQ(fp32.scalar_type(), at::kFloat);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  const at::Tensor bf16 = s->executor().fetch_weight(name);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(bf16, fp32.to(at::kBFloat16)));
}

TEST_F(QloraTest, Nf4WeightsTakeAtMostSixteenPercentOfFp32) {
  if (const std::string why = test::categories_not_counted_here(); !why.empty())
    GTEST_SKIP() << why;
  auto& acct = MemoryAccounting::instance();
  const int64_t before = acct.snapshot().current[TF_MEM_WEIGHTS];
  auto s = test::make_session(recipe(lora() + quant("nf4")));
  int64_t quantized_numel = 0, dense_bytes = 0;
  for (const Param& p : s->store().all()) {
    if (p.format == TF_FORMAT_NF4)
      quantized_numel += p.numel();
    else if (!(p.flags & TF_PARAM_ADAPTER))
      dense_bytes += p.value.numel() * p.value.element_size();
  }
  ASSERT_GT(quantized_numel, 0);
  const int64_t compact = acct.snapshot().current[TF_MEM_WEIGHTS] - before - dense_bytes;
  const double ratio = static_cast<double>(compact) / static_cast<double>(4 * quantized_numel);
  EXPECT_LE(ratio, 0.16) << compact << " bytes for " << quantized_numel << " weights";
  EXPECT_GT(ratio, 0.12);
}

TEST_F(QloraTest, QloraTrainsAndResumesExactly) {
  auto make = [&](const std::string& out, bool resume, int64_t stop) {
    std::string r = recipe(lora() + quant("nf4"), out);
    r.replace(r.find("steps = 4"), 9, "steps = 40");
    r.replace(r.find("lr = 1e-3"), 9, "lr = 2e-2");
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop;
    return test::make_session(r, o)->train();
  };
  const TrainSummary full = make(dir.str() + "/a", false, -1);
  auto mean = [](auto begin, auto end) {
    return std::accumulate(begin, end, 0.0) / static_cast<double>(end - begin);
  };
  const double head = mean(full.losses.begin(), full.losses.begin() + 5),
               tail = mean(full.losses.end() - 5, full.losses.end());
  EXPECT_LT(tail, head - 0.2) << head << " -> " << tail;
  make(dir.str() + "/b", false, 17);
  const TrainSummary rest = make(dir.str() + "/b", true, -1);
  ASSERT_EQ(rest.losses.size(), 23u);
  for (size_t i = 0; i < 23; ++i)
    EXPECT_EQ(rest.losses[i], full.losses[17 + i]) << "step " << 17 + i;
}

// bf16 adapters (precision's bf16 weights) over the fp32 dequantized NF4
// base: the low-rank term is computed in the adapters' dtype, as PEFT does,
// and the run trains.
TEST_F(QloraTest, Bf16AdaptersOverAnNf4BaseTrain) {
  std::string r =
      recipe(lora() + quant("nf4") + "[[strategy]]\nplugin = \"precision\"\nmode = \"bf16\"\n");
  r.replace(r.find("steps = 4"), 9, "steps = 30");
  r.replace(r.find("lr = 1e-3"), 9, "lr = 2e-2");
  auto s = test::make_session(r);
  EXPECT_EQ(s->store().get("model.layers.0.self_attn.q_proj.lora_A.weight").value.scalar_type(),
            at::kBFloat16);
  const TrainSummary sum = s->train();
  ASSERT_EQ(sum.losses.size(), 30u);
  EXPECT_LT(sum.losses.back(), sum.losses.front() - 0.2);
}

TEST_F(QloraTest, BadCombinationsAreRecipeErrors) {
  try {
    test::make_session(recipe(quant("nf4")), {}, "q.toml");
    FAIL() << "quantize on trainable weights was accepted";
  } catch (const RecipeError& e) {
    EXPECT_TRUE(
        std::regex_search(e.what(), std::regex("^q\\.toml:\\d+:10: quantize: .*trainable.*lora")))
        << e.what();
  }
  try {
    test::make_session(recipe(lora("[\"c_attn\"]")), {}, "l.toml");
    FAIL() << "a target that matches nothing was accepted";
  } catch (const RecipeError& e) {
    EXPECT_TRUE(std::regex_search(
        e.what(), std::regex("^l\\.toml:\\d+:10: lora: targets \\[c_attn\\] match no")))
        << e.what();
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.q_proj.weight"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

class Adam8Test : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& strategies, const std::string& out) const {
    std::string r = test::tiny_recipe(corpus, out, "", strategies);
    r.replace(r.find("steps = 4"), 9, "steps = 20");
    r.replace(r.find("n_embd = 32"), 11, "n_embd = 64");
    return r;
  }
  static constexpr const char* kAdam8 =
      "[[strategy]]\nplugin = \"quantize\"\nweights = false\noptimizer_state = \"int8\"\n";
  // The same optimizer as its own strategy (no weight quantization about it).
  static constexpr const char* kAdamW8 = "[[strategy]]\nplugin = \"adamw8\"\n";
};

// adamw8 and quantize's optimizer_state = "int8" are one implementation:
// the same losses to the bit, and the kernel's fp32 state is never made.
TEST_F(Adam8Test, TheAdamW8StrategyIsQuantizesInt8StateBitForBit) {
  auto& acct = MemoryAccounting::instance();
  const TrainSummary q = test::make_session(recipe(kAdam8, dir.str() + "/q"))->train();
  const int64_t before = acct.snapshot().current[TF_MEM_OPTIMIZER];
  auto s = test::make_session(recipe(kAdamW8, dir.str() + "/s"));
  const TrainSummary a = s->train();
  EXPECT_EQ(s->update().optimizer().state_bytes(), 0);
  // Its int8 state, counted (by category: on the CPU only, test_support.hpp).
  if (test::categories_not_counted_here().empty()) {
    EXPECT_GT(acct.snapshot().current[TF_MEM_OPTIMIZER], before);
  }
  ASSERT_EQ(a.losses.size(), q.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], q.losses[i]) << "step " << i;
  // Resumed mid-run, it repeats the uninterrupted run.
  SessionOptions o;
  o.stop_after_steps = 8;
  test::make_session(recipe(kAdamW8, dir.str() + "/r"), o)->train();
  o.stop_after_steps = -1;
  o.resume = true;
  const TrainSummary rest = test::make_session(recipe(kAdamW8, dir.str() + "/r"), o)->train();
  ASSERT_EQ(rest.losses.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(rest.losses[i], a.losses[8 + i]) << "step " << 8 + i;
}

// 8-bit AdamW state with another optimizer is refused, never ignored.
TEST_F(Adam8Test, AnOptimizerThatIsNotAdamWIsRefused) {
  std::string r = recipe(kAdamW8, dir.str() + "/sgd");
  r.replace(r.find("[optimizer]\n"), 12, "[optimizer]\nname = \"sgd\"\n");
  try {
    test::make_session(r)->train();
    FAIL() << "adamw8 with SGD trained";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("name = \"adamw\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("adamw8"), std::string::npos) << e.what();
  }
}

TEST_F(Adam8Test, FollowsFp32AdamWWithQuarterOfTheStateBytes) {
  auto& acct = MemoryAccounting::instance();
  const int64_t before = acct.snapshot().current[TF_MEM_OPTIMIZER];
  auto fp32 = test::make_session(recipe("", dir.str() + "/a"));
  const TrainSummary a = fp32->train();
  const int64_t fp32_state = fp32->update().optimizer().state_bytes();
  fp32.reset();
  auto int8 = test::make_session(recipe(kAdam8, dir.str() + "/b"));
  const TrainSummary b = int8->train();
  const int64_t int8_state = acct.snapshot().current[TF_MEM_OPTIMIZER] - before;
  EXPECT_EQ(int8->update().optimizer().state_bytes(), 0);  // the kernel's fp32 state is never made
  ASSERT_EQ(a.losses.size(), b.losses.size());
  double worst = 0;
  for (size_t i = 0; i < a.losses.size(); ++i)
    worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]));
  RecordProperty("max_loss_gap", c10::str(worst));
  RecordProperty("state_ratio",
                 c10::str(static_cast<double>(int8_state) / static_cast<double>(fp32_state)));
  EXPECT_LE(worst, 0.05) << "stated tolerance: losses within 0.05 nats of fp32 AdamW over 20 steps";
  EXPECT_LT(b.losses.back(), b.losses.front() - 0.5);
  EXPECT_LE(static_cast<double>(int8_state), 0.27 * static_cast<double>(fp32_state))
      << int8_state << " vs " << fp32_state;
}

TEST_F(Adam8Test, ResumesExactly) {
  auto run = [&](const std::string& out, bool resume, int64_t stop) {
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop;
    return test::make_session(recipe(kAdam8, out), o)->train();
  };
  const TrainSummary full = run(dir.str() + "/a", false, -1);
  run(dir.str() + "/b", false, 8);
  const TrainSummary rest = run(dir.str() + "/b", true, -1);
  ASSERT_EQ(rest.losses.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(rest.losses[i], full.losses[8 + i]) << "step " << 8 + i;
}

}  // namespace
}  // namespace tightfit
