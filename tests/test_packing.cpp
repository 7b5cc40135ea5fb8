// Packed rows ([data] packing = true): several examples to a row, placed
// best-fit decreasing, each with positions from 0; a packed row trains
// exactly as its examples do on rows of their own (loss and every gradient,
// checkpointed stages recomputed with the same positions); models that cannot
// keep examples apart, and text corpora, are refused by name. Parity with
// transformers' position_ids is in test_hf_parity (HfPackedParity).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "cross_entropy.hpp"
#include "example_batcher.hpp"
#include "recipe.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

// Example i has ids 100 i + t for t < 3 + i, trained on its second half.
std::vector<Example> numbered_examples(int n) {
  std::vector<Example> ex;
  for (int i = 0; i < n; ++i) {
    Example e;
    const int len = 3 + i;
    for (int t = 0; t < len; ++t) e.ids.push_back(100 * i + t);
    e.trained.assign(static_cast<size_t>(len), 0);
    for (int t = len / 2; t < len; ++t) e.trained[static_cast<size_t>(t)] = 1;
    ex.push_back(e);
  }
  return ex;
}

// Every row: examples one after another, each from position 0, its own ids
// and targets (none reaching into the next), then padding that nothing trains
// on and the attention mask marks 0. Returns the examples seen, in order.
std::vector<int64_t> check_rows(const Batcher::Batch& b, int64_t seq_len, int64_t pad) {
  std::vector<int64_t> seen;
  const int64_t B = b.tokens.size(0), T = seq_len;
  EXPECT_EQ(b.positions.sizes(), b.tokens.sizes());
  for (int64_t r = 0; r < B; ++r) {
    int64_t t = 0;
    while (t < T && b.tokens[r][t].item<int64_t>() != pad) {
      const int64_t example = b.tokens[r][t].item<int64_t>() / 100;
      const int64_t ids = std::min<int64_t>(3 + example, T + 1), n = ids - 1;
      seen.push_back(example);
      for (int64_t k = 0; k < n; ++k) {
        EXPECT_EQ(b.positions[r][t + k].item<int64_t>(), k);
        if (b.attention_mask.defined()) {
          EXPECT_EQ(b.attention_mask[r][t + k].item<int64_t>(), 1);
        }
        EXPECT_EQ(b.tokens[r][t + k].item<int64_t>(), 100 * example + k);
        const bool trained = k + 1 >= (3 + example) / 2;
        EXPECT_EQ(b.targets[r][t + k].item<int64_t>(),
                  trained ? 100 * example + k + 1 : kIgnoreIndex)
            << "example " << example << " token " << k;
      }
      t += n;
    }
    for (int64_t k = t; k < T; ++k) {
      EXPECT_EQ(b.tokens[r][k].item<int64_t>(), pad);
      EXPECT_EQ(b.targets[r][k].item<int64_t>(), kIgnoreIndex);
      EXPECT_EQ(b.positions[r][k].item<int64_t>(), k - t);  // padding counts from 0 on its own
      EXPECT_TRUE(b.attention_mask.defined());
      if (!b.attention_mask.defined()) return seen;
      EXPECT_EQ(b.attention_mask[r][k].item<int64_t>(), 0);
    }
  }
  return seen;
}

TEST(ExampleBatcherPacking, PacksBestFitDecreasingAndKeepsExamplesApart) {
  const int64_t T = 16, B = 4, pad = -7;
  ExampleBatcher packed(numbered_examples(24), T, B, /*seed=*/5, /*val_fraction=*/0.25, pad,
                        /*packing=*/true);
  ExampleBatcher padded(numbered_examples(24), T, B, 5, 0.25, pad);
  const auto& c = packed.counts();
  EXPECT_EQ(c.train, padded.counts().train);  // the same split either way
  EXPECT_EQ(c.trained_tokens, padded.counts().trained_tokens);
  EXPECT_EQ(padded.counts().rows, padded.counts().train);
  EXPECT_LT(c.rows, c.train);
  EXPECT_GT(c.row_fill, padded.counts().row_fill);
  EXPECT_LE(c.row_fill, 1.0);
  const Batcher::Batch unpacked = padded.next();
  EXPECT_FALSE(unpacked.positions.defined());  // unpacked rows keep the default positions
  // One example a row, then padding, which the mask tells apart.
  ASSERT_TRUE(unpacked.attention_mask.defined());
  EXPECT_TRUE(at::equal(unpacked.attention_mask, unpacked.tokens.ne(pad).to(at::kLong)));
  EXPECT_LT(unpacked.attention_mask.sum().item<int64_t>(), B * T);

  // One epoch of rows holds every training example exactly once.
  std::multiset<int64_t> epoch;
  for (int64_t step = 0; step * B < c.rows; ++step) {
    const Batcher::Batch b = packed.next();
    check_rows(b, T, pad);
    // Rows past the epoch's last come from the next one.
    for (int64_t row = 0; row < B && step * B + row < c.rows; ++row) {
      Batcher::Batch one{b.tokens.narrow(0, row, 1), b.targets.narrow(0, row, 1),
                         b.positions.narrow(0, row, 1)};
      if (b.attention_mask.defined()) one.attention_mask = b.attention_mask.narrow(0, row, 1);
      for (int64_t e : check_rows(one, T, pad)) epoch.insert(e);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(epoch.size()), c.train);
  EXPECT_EQ(std::set<int64_t>(epoch.begin(), epoch.end()).size(), epoch.size());
  // Validation rows are packed too, from the held-out examples only.
  const std::vector<int64_t> val = check_rows(packed.validation(0), T, pad);
  for (int64_t e : val) EXPECT_EQ(epoch.count(e), 0u) << e;

  // Deterministic in (seed, position).
  ExampleBatcher again(numbered_examples(24), T, B, 5, 0.25, pad, true);
  again.set_position(2);
  packed.set_position(2);
  const auto x = again.next(), y = packed.next();
  EXPECT_TRUE(at::equal(x.tokens, y.tokens));
  EXPECT_TRUE(at::equal(x.positions, y.positions));
}

// Examples of these lengths (7, 5 and 3 tokens unless told) with their
// targets (-100 on prompts).
struct Examples {
  std::vector<at::Tensor> tokens, targets;
};
Examples three_examples(std::vector<int64_t> lengths = {7, 5, 3}) {
  at::manual_seed(11);
  Examples ex;
  for (int64_t n : lengths) {
    ex.tokens.push_back(at::randint(0, 256, {n}, at::kLong));
    at::Tensor tgt = at::randint(0, 256, {n}, at::kLong);
    tgt.narrow(0, 0, n / 2).fill_(kIgnoreIndex);
    ex.targets.push_back(tgt);
  }
  return ex;
}

struct Grads {
  double loss;
  std::map<std::string, at::Tensor> grads;
};

Grads pass(Session& s, const at::Tensor& tokens, const at::Tensor& targets,
           const at::Tensor& positions) {
  s.update().zero_grad();
  Grads g;
  g.loss = s.executor().run_pass(tokens, targets, /*backward=*/true, 1.0, positions).loss;
  for (const Param& p : s.store().all())
    if (p.value.grad().defined()) g.grads[p.name] = p.value.grad().to_dense().clone();
  return g;
}

class PackedEqualsUnpacked : public ::testing::TestWithParam<std::pair<const char*, std::string>> {
};

// The packed row [a b c pad] and the rows [a pad] [b pad] [c pad] give the same
// loss (the mean over the same trained targets) and the same gradients; a
// row of T tokens, the examples `lengths` long.
void expect_packed_equals_unpacked(const std::string& model, const std::string& extra,
                                   std::vector<int64_t> lengths, int64_t T) {
  test::TempDir dir;
  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str(), "", extra);
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin, "[model]\n" + model + "\n");
  auto s = test::make_session(recipe);
  const Examples ex = three_examples(std::move(lengths));

  at::Tensor tokens = at::zeros({1, T}, at::kLong), targets = at::full({1, T}, kIgnoreIndex);
  at::Tensor positions = at::empty({1, T}, at::kLong);
  at::Tensor rows = at::zeros({3, T}, at::kLong), row_targets = at::full({3, T}, kIgnoreIndex);
  int64_t used = 0;
  for (size_t i = 0; i < 3; ++i) {
    const int64_t n = ex.tokens[i].size(0);
    tokens[0].narrow(0, used, n).copy_(ex.tokens[i]);
    targets[0].narrow(0, used, n).copy_(ex.targets[i]);
    positions[0].narrow(0, used, n).copy_(at::arange(n, at::kLong));
    rows[static_cast<int64_t>(i)].narrow(0, 0, n).copy_(ex.tokens[i]);
    row_targets[static_cast<int64_t>(i)].narrow(0, 0, n).copy_(ex.targets[i]);
    used += n;
  }
  positions[0].narrow(0, used, T - used).copy_(at::arange(T - used, at::kLong));

  const Grads a = pass(*s, tokens, targets, positions);
  const Grads b = pass(*s, rows, row_targets, at::Tensor());
  EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(b.loss));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  ASSERT_FALSE(a.grads.empty());
  for (const auto& [name, g] : a.grads) {
    const at::Tensor& expected = b.grads.at(name);
    const double rel =
        (g - expected).abs().max().item<double>() / (expected.abs().max().item<double>() + 1e-12);
    EXPECT_LE(rel, 1e-5) << name;
  }
  // Without its positions the packed row is one long example: not the same
  // gradients, by far more than the tolerance above (the loss of a tiny random
  // model can move less: its attention is nearly uniform).
  const Grads mixed = pass(*s, tokens, targets, at::Tensor());
  double most = 0;
  for (const auto& [name, g] : mixed.grads) {
    const at::Tensor& expected = b.grads.at(name);
    most = std::max(most, (g - expected).abs().max().item<double>() /
                              (expected.abs().max().item<double>() + 1e-12));
  }
  EXPECT_GT(most, 1e-2);
}

TEST_P(PackedEqualsUnpacked, SameLossAndGradients) {
  expect_packed_equals_unpacked(GetParam().first, GetParam().second, {7, 5, 3}, 20);
}

// A packed row of 2,112 tokens attends in tiles (tiled_attention.hpp: no
// [T, T] mask) where the rows apart take LibTorch's causal kernel: the same
// loss and gradients within 1e-5 all the same.
TEST(PackedEqualsUnpacked, ALongPackedRowAttendsInTiles) {
  expect_packed_equals_unpacked(
      "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
      "n_kv_head = 2\nintermediate_size = 64\nmax_positions = 2112\n",
      "", {1100, 700, 300}, 2112);
}

INSTANTIATE_TEST_SUITE_P(
    Models, PackedEqualsUnpacked,
    ::testing::Values(
        std::pair<const char*, std::string>{"plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = "
                                            "2\nn_embd = 32\nn_head = 2\nn_positions = 64\n",
                                            ""},
        // Grouped-query attention; every block recomputed in backward.
        std::pair<const char*, std::string>{
            "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
            "n_kv_head = 2\nintermediate_size = 64\nmax_positions = 64\n",
            "[[strategy]]\nplugin = \"checkpoint\"\n"}),
    [](const auto& info) { return info.index == 0 ? "gpt2" : "llama_checkpointed"; });

std::string prompt_rows(const test::TempDir& d) {
  std::string rows;
  for (int i = 0; i < 60; ++i)
    rows += R"({"prompt": "count )" + std::to_string(i) + R"(:", "completion": " )" +
            std::to_string(i + 1) + " " + std::to_string(i + 2) + "\"}\n";
  return test::write_file(d, "rows.jsonl", rows);
}

std::string packed_recipe(const test::TempDir& d, const std::string& model,
                          const std::string& corpus) {
  return "[run]\nname = \"packed\"\nseed = 3\nsteps = 25\nout_dir = \"" + d.str() +
         "\"\nsample_tokens = 0\neval_batches = 1\nlog_every = 1000\n\n[model]\n" + model +
         "\n[data]\ncorpus = \"" + corpus +
         "\"\ntokenizer = \"byte\"\nseq_len = 64\nbatch_size = 4\nval_fraction = 0.1\n"
         "packing = true\n\n[optimizer]\nlr = 3e-3\n\n[schedule]\nplugin = \"standard\"\n"
         "warmup_steps = 2\n";
}

// Prompt/completion rows packed: the summary says how, and the answers are learnt.
TEST(Packing, FineTuneOnPackedRowsLearnsTheAnswers) {
  test::TempDir d;
  auto s = test::make_session(packed_recipe(
      d,
      "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
      "n_kv_head = 2\nintermediate_size = 64\nmax_positions = 64\n",
      prompt_rows(d)));
  const TrainSummary sum = s->train();
  EXPECT_NE(sum.data.find("60 examples: 54 train, 6 validation"), std::string::npos) << sum.data;
  EXPECT_NE(sum.data.find("packed 54 into 13 rows of 64 tokens"), std::string::npos) << sum.data;
  ASSERT_GE(sum.losses.size(), 25u);
  EXPECT_LT(sum.losses.back(), sum.losses.front() * 0.7);
  EXPECT_TRUE(std::isfinite(sum.val_loss));
}

TEST(Packing, RefusedWhereExamplesCannotBeKeptApart) {
  test::TempDir d;
  try {  // RWKV's recurrence carries state from one example into the next
    test::make_session(packed_recipe(d, "plugin = \"rwkv\"\npreset = \"tiny\"\n", prompt_rows(d)));
    ADD_FAILURE() << "rwkv with packing = true was accepted";
  } catch (const RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("TF_MODEL_FEATURE_POSITIONS"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("packing = false"), std::string::npos) << e.what();
  }
  try {  // a text corpus is one stream already
    test::make_session(
        packed_recipe(d, "plugin = \"gpt2\"\npreset = \"tiny\"\n", test::write_corpus(d)));
    ADD_FAILURE() << "a text corpus with packing = true was accepted";
  } catch (const RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("is text"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tightfit
