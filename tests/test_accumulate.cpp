// Gradient accumulation: the accumulate schedule's update equals one update
// over the concatenated batch; fused_update under accumulation waits for the
// last micro-batch and then gives the same weights; 8-bit AdamW state is
// used by fused updates too.
#include <gtest/gtest.h>

#include "test_support.hpp"

namespace tightfit {
namespace {

using Weights = std::map<std::string, at::Tensor>;

Weights weights(Session& s) {
  Weights out;
  for (const Param& p : s.store().all()) out[p.name] = p.value.detach().clone();
  return out;
}

void expect_close(const Weights& got, const Weights& expected, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [name, w] : expected) {
    const double rel =
        (got.at(name) - w).abs().max().item<double>() / (w.abs().max().item<double>() + 1e-12);
    EXPECT_LE(rel, tol) << name << " — " << what;
  }
}

class AccumulateTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  // Constant lr so that the schedule and a hand-driven reference agree.
  std::string recipe(const std::string& schedule, const std::string& strategies,
                     int batch_size) const {
    std::string r = test::tiny_recipe(corpus, dir.str(), "", strategies);
    r.replace(r.find("batch_size = 4"), 14, "batch_size = " + std::to_string(batch_size));
    r.replace(r.find("steps = 4"), 9, "steps = 3");
    r.replace(r.find("lr = 1e-3"), 9, "lr = 1e-3\ngrad_clip = 0.0");
    r.replace(r.find("[schedule]\nplugin = \"standard\"\nwarmup_steps = 2"), 47,
              "[schedule]\n" + schedule + "warmup_steps = 0\ndecay = \"constant\"");
    return r;
  }
  static constexpr const char* kAccumulate = "plugin = \"accumulate\"\nmicro_batches = 3\n";
  static constexpr const char* kStandard = "plugin = \"standard\"\n";
  static constexpr const char* kFused =
      "[[strategy]]\nplugin = \"fused_update\"\nclip = \"none\"\n";
};

// The accumulate schedule's 3 steps of 3 micro-batches of 2 against the
// same micro-batches concatenated into one batch of 6 per step, trained on
// `data` (a corpus or examples file). Returns each micro-batch's counted
// targets, step by step.
std::vector<int64_t> expect_equals_whole_batch(const std::string& recipe_text) {
  // SGD: its update is linear in the gradient, so the weights compare the
  // gradients themselves (AdamW would magnify rounding noise in gradients that
  // are zero in exact arithmetic, such as the attention key bias's).
  auto sgd = [](std::string r) {
    r.replace(r.find("lr = 1e-3"), 9, "name = \"sgd\"\nlr = 0.5\nweight_decay = 0.0");
    return r;
  };
  std::string standard = recipe_text;
  const std::string acc_schedule = "plugin = \"accumulate\"\nmicro_batches = 3\n";
  standard.replace(standard.find(acc_schedule), acc_schedule.size(), "plugin = \"standard\"\n");
  auto acc = test::make_session(sgd(recipe_text));
  const TrainSummary sum = acc->train();
  EXPECT_EQ(sum.losses.size(), 3u);
  EXPECT_EQ(sum.backward_passes, 9);

  // Reference: the same three micro-batches concatenated into one batch of 6.
  auto ref = test::make_session(sgd(standard));
  std::vector<int64_t> counts;
  for (int step = 0; step < 3; ++step) {
    std::vector<at::Tensor> tokens, targets;
    for (int i = 0; i < 3; ++i) {
      auto b = ref->data().batcher().next();
      tokens.push_back(b.tokens);
      targets.push_back(b.targets);
      counts.push_back(b.targets.ne(-100).sum().item<int64_t>());
    }
    ref->update().zero_grad();
    const PassResult r = ref->executor().run_pass(at::cat(tokens), at::cat(targets), true, 1.0);
    EXPECT_EQ(ref->update().optimizer_step(), TF_OK);
    if (sum.losses.size() == 3u) {
      EXPECT_NEAR(sum.losses[static_cast<size_t>(step)], r.loss, 1e-5 * r.loss) << "step " << step;
    }
  }
  expect_close(weights(*acc), weights(*ref), 1e-5, "accumulate vs concatenated batch");
  return counts;
}

TEST_F(AccumulateTest, EqualsOneUpdateOverTheWholeBatch) {
  expect_equals_whole_batch(recipe(kAccumulate, "", 2));
}

// Prompt/completion rows whose answers differ in length: micro-batches count
// different numbers of targets (the prompt and the padding count none), so
// each weighs by its share of the step's, not by 1/3 (Hugging Face's
// gradient accumulation fix, transformers 4.46).
TEST_F(AccumulateTest, MicroBatchesOfUnequalTargetCountsEqualTheWholeBatch) {
  std::string rows;
  for (int i = 0; i < 48; ++i) {
    std::string answer;
    for (int w = 0; w <= (i * 7) % 5; ++w) answer += " " + std::to_string(i + w);
    rows +=
        R"({"prompt": "count )" + std::to_string(i) + R"(:", "completion": ")" + answer + "\"}\n";
  }
  std::string r = recipe(kAccumulate, "", 2);
  r.replace(r.find(corpus), corpus.size(), test::write_file(dir, "rows.jsonl", rows));
  r.replace(r.find("seq_len = 32"), 12, "seq_len = 40");
  const std::vector<int64_t> counts = expect_equals_whole_batch(r);
  ASSERT_EQ(counts.size(), 9u);
  // Unequal within a step: the case an equal weighting gets wrong.
  EXPECT_TRUE(counts[0] != counts[1] || counts[1] != counts[2]) << counts[0] << " " << counts[1];
}

TEST_F(AccumulateTest, FusedUpdateWaitsForTheLastMicroBatch) {
  const std::string ckpt = "[[strategy]]\nplugin = \"checkpoint\"\n";
  auto plain = test::make_session(recipe(kAccumulate, "", 2));
  plain->train();
  const Weights expected = weights(*plain);
  for (const std::string& stack : {std::string(kFused), ckpt + kFused}) {
    auto s = test::make_session(recipe(kAccumulate, stack, 2));
    s->train();
    expect_close(weights(*s), expected, 1e-6, stack);
  }
}

TEST_F(AccumulateTest, FusedUpdateKeepsGradientsUntilTheLastMicroBatch) {
  auto s = test::make_session(recipe(kAccumulate, kFused, 2));
  auto grads_left = [&] {
    int64_t n = 0;
    for (const Param& p : s->store().all())
      if (p.value.grad().defined()) ++n;
    return n;
  };
  const Weights before = weights(*s);
  s->update().zero_grad();
  for (int i = 0; i < 2; ++i) {
    s->update().set_micro_batch(i, 2);
    auto b = s->data().batcher().next();
    s->executor().run_pass(b.tokens, b.targets, true, 0.5);
    if (i == 0) {
      EXPECT_EQ(grads_left(), static_cast<int64_t>(s->store().trainable().size()));
      expect_close(weights(*s), before, 0.0, "no update before the last micro-batch");
    }
  }
  EXPECT_EQ(grads_left(), 0);  // all consumed by the fused update in the last backward
  const double moved =
      (weights(*s).at("transformer.wte.weight") - before.at("transformer.wte.weight"))
          .abs()
          .max()
          .item<double>();
  EXPECT_GT(moved, 0.0);
  EXPECT_EQ(s->update().optimizer_step(), TF_OK);
  EXPECT_EQ(s->update().micro_batch_count(), 1);  // reset for the next step
}

TEST_F(AccumulateTest, EightBitAdamWStateServesFusedUpdates) {
  const std::string adam8 =
      "[[strategy]]\nplugin = \"quantize\"\nweights = false\noptimizer_state = \"int8\"\n";
  auto a = test::make_session(recipe(kStandard, adam8, 4));
  a->train();
  auto b = test::make_session(recipe(kStandard, adam8 + kFused, 4));
  b->train();
  // Same int8 state, same step numbers: the same weights.
  expect_close(weights(*b), weights(*a), 1e-6, "adam8 + fused_update vs adam8");
  // And the kernel holds no fp32 moments: the state is quantize's.
  EXPECT_EQ(b->update().optimizer().state_bytes(), 0);
}

TEST_F(AccumulateTest, RejectsABadMicroBatchDeclaration) {
  auto s = test::make_session(recipe(kStandard, "", 2));
  EXPECT_THROW(s->update().set_micro_batch(2, 2), std::invalid_argument);
  EXPECT_THROW(s->update().set_micro_batch(0, 0), std::invalid_argument);
}

}  // namespace
}  // namespace tightfit
