// Online RL's sampling (completion_sampler.hpp): each draw follows the
// distribution transformers' generate samples from after its temperature,
// top-k and top-p warpers (tests/peers/sampling_warpers.py), where seeded
// draws of two libraries cannot agree; and a prompt's completions decoded
// together, n rows through one key/value cache, are the tokens one row
// recomputing its whole context gives, each ending at its stop id; and
// prompts of different lengths decoded together, left-padded, are what each
// gives alone.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "completion_sampler.hpp"
#include "executor.hpp"
#include "file_util.hpp"
#include "kernel_parts.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

struct Rule {
  const char* name;
  double temperature;
  int64_t top_k;
  double top_p;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
};

void PrintTo(const Rule& r, std::ostream* os) {
  *os << r.name;
}

class SamplerDistribution : public ::testing::TestWithParam<Rule> {};

TEST_P(SamplerDistribution, DrawsFollowTransformersWarpedProbabilities) {
  const Rule& rule = GetParam();
  const std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.2f, -0.5f, -1.0f, 0.9f, 1.4f};
  test::TempDir d;
  // The row so far: ids the repetition penalty weighs (a positive logit, a
  // negative one, one repeated).
  const std::vector<int64_t> context = {0, 4, 2, 4};
  std::ofstream(d.str() + "/rule.json")
      << nlohmann::json({{"logits", logits},
                         {"temperature", rule.temperature},
                         {"top_k", rule.top_k},
                         {"top_p", rule.top_p},
                         {"min_p", rule.min_p},
                         {"repetition_penalty", rule.repetition_penalty},
                         {"context", context}})
             .dump();
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                          "/tests/peers/sampling_warpers.py " + d.str() + " > " + d.str() +
                          "/peer.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file_text(d.str() + "/peer.log");
  const auto want =
      nlohmann::json::parse(read_file_text(d.str() + "/probs.json")).get<std::vector<double>>();
  // Many rows at once, as a group's rows are drawn.
  constexpr int64_t kRows = 60000;
  const at::Tensor batch = at::tensor(logits).unsqueeze(0).expand({kRows, -1}).contiguous();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  const at::Tensor rows_so_far = at::tensor(context).unsqueeze(0).expand({kRows, -1}).contiguous();
  const at::Tensor drawn = sample_next_tokens(
      batch, {rule.temperature, rule.top_k, rule.top_p, rule.min_p, rule.repetition_penalty}, gen,
      rows_so_far);
  const at::Tensor counts = at::bincount(drawn, {}, static_cast<int64_t>(logits.size()));
  for (size_t v = 0; v < logits.size(); ++v) {
    const double p = want[v], seen = counts[static_cast<int64_t>(v)].item<double>() / kRows;
    if (p == 0) {
      EXPECT_EQ(seen, 0.0) << "token " << v << " is warped away and was drawn";
      continue;
    }
    // Five standard deviations of a binomial share.
    EXPECT_NEAR(seen, p, 5 * std::sqrt(p * (1 - p) / kRows) + 1e-9) << "token " << v;
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, SamplerDistribution,
                         ::testing::Values(Rule{"plain", 1.0, 0, 1.0},
                                           Rule{"temperature", 0.6, 0, 1.0},
                                           Rule{"top_k", 1.3, 3, 1.0}, Rule{"top_p", 1.0, 0, 0.7},
                                           Rule{"all_three", 0.8, 5, 0.8},
                                           Rule{"min_p", 1.0, 0, 1.0, 0.4},
                                           Rule{"repetition_penalty", 1.0, 0, 1.0, 0.0, 1.8},
                                           Rule{"all_five", 0.8, 6, 0.9, 0.2, 1.3}),
                         [](const auto& info) { return std::string(info.param.name); });

// `plugin`'s tiny model: its n rows prefilled once and fanned out
// (TF_MODEL_FEATURE_DECODE_FANOUT), decoded together.
void group_decoded_together(const std::string& plugin) {
  test::TempDir dir;
  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str());
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin,
                 "[model]\nplugin = \"" + plugin + "\"\npreset = \"tiny\"\nvocab_size = 256\n\n");
  SessionOptions so;
  so.skip_data = true;
  auto s = test::make_session(recipe, so);
  const std::vector<int64_t> prompt = {84, 104, 101, 32, 99, 97, 116};
  // Greedy, one row recomputing its whole context each token.
  std::vector<int64_t> want = prompt;
  {
    at::NoGradGuard no_grad;
    for (int i = 0; i < 12; ++i)
      want.push_back(s->executor()
                         .forward_logits(at::tensor(want, at::kLong).unsqueeze(0), false)[0][-1]
                         .argmax()
                         .item<int64_t>());
  }
  CompletionRequest r;
  r.prompts = {prompt};
  r.seeds = {0};
  r.n = 3;
  r.max_new_tokens = 12;
  r.rule = {0.0, 0, 1.0};
  const Completions got = sample_completions(s->parts(), r, /*pad_id=*/0);
  ASSERT_EQ(got.ids.size(0), 3);
  for (int64_t row = 0; row < 3; ++row) {
    EXPECT_EQ(got.lengths[row].item<int64_t>(), 12);
    for (int64_t t = 0; t < 12; ++t)
      EXPECT_EQ(got.ids[row][t].item<int64_t>(), want[prompt.size() + static_cast<size_t>(t)])
          << "row " << row << ", token " << t;
  }
  // A prompt fed in pieces of one token (a long prompt's prefill, whose
  // logits would not fit at once) decodes the same tokens.
  {
    CompletionRequest pieces = r;
    pieces.prefill_logits_bytes = 1;
    const Completions in_pieces = sample_completions(s->parts(), pieces, /*pad_id=*/0);
    EXPECT_TRUE(in_pieces.ids.equal(got.ids)) << in_pieces.ids << "\n" << got.ids;
  }
  // The fourth greedy token as a stop id: every row ends with it, kept.
  r.stop_ids = {want[prompt.size() + 3]};
  const Completions stopped = sample_completions(s->parts(), r, /*pad_id=*/0);
  for (int64_t row = 0; row < 3; ++row) {
    const int64_t first_stop =
        static_cast<int64_t>(std::find(want.begin() + static_cast<std::ptrdiff_t>(prompt.size()),
                                       want.end(), r.stop_ids[0]) -
                             want.begin() - static_cast<std::ptrdiff_t>(prompt.size()));
    EXPECT_EQ(stopped.lengths[row].item<int64_t>(), first_stop + 1);
  }
  // Sampled rows differ from each other (one generator draws them all).
  r.stop_ids.clear();
  r.rule = {1.5, 0, 1.0};
  r.n = 4;
  const Completions sampled = sample_completions(s->parts(), r, 0);
  EXPECT_FALSE(sampled.ids[0].equal(sampled.ids[1]) && sampled.ids[1].equal(sampled.ids[2]) &&
               sampled.ids[2].equal(sampled.ids[3]));
  // Bad values are refused by name.
  r.n = 0;
  EXPECT_THROW(sample_completions(s->parts(), r, 0), std::invalid_argument);
}

TEST(CompletionSampler, AGroupDecodedTogetherIsWhatOneRowRecomputingGives) {
  group_decoded_together("llama");
}

TEST(CompletionSampler, ARecurrentGroupDecodedTogetherIsWhatOneRowRecomputingGives) {
  group_decoded_together("rwkv");
}

// Prompts of different lengths in one decode (llama's decode_rows: the
// shorter left-padded, each row's positions from its own start) sample what
// each prompt sampled alone with its seed gives: greedy, and drawn.
TEST(CompletionSampler, PromptsOfDifferentLengthsTogetherAreEachAlone) {
  test::TempDir dir;
  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str());
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin,
                 "[model]\nplugin = \"llama\"\npreset = \"tiny\"\nvocab_size = 256\n\n");
  SessionOptions so;
  so.skip_data = true;
  auto s = test::make_session(recipe, so);
  const std::vector<std::vector<int64_t>> prompts = {
      {84, 104, 101, 32, 99, 97, 116}, {65, 32}, {100, 111, 103, 115, 32}};
  const std::vector<uint64_t> seeds = {7, 8, 9};
  for (const SamplingRule rule : {SamplingRule{0.0, 0, 1.0}, SamplingRule{1.3, 0, 1.0},
                                  SamplingRule{0.9, 20, 0.9, 0.05, 1.2}}) {
    CompletionRequest r;
    r.prompts = prompts;
    r.seeds = seeds;
    r.n = 2;
    r.max_new_tokens = 10;
    r.rule = rule;
    r.stop_ids = {101};
    const Completions together = sample_completions(s->parts(), r, /*pad_id=*/0);
    ASSERT_EQ(together.ids.size(0), 6);
    for (size_t b = 0; b < prompts.size(); ++b) {
      CompletionRequest one = r;
      one.prompts = {prompts[b]};
      one.seeds = {seeds[b]};
      const Completions alone = sample_completions(s->parts(), one, 0);
      const auto rows = static_cast<int64_t>(b) * 2;
      EXPECT_TRUE(together.lengths.narrow(0, rows, 2).equal(alone.lengths))
          << "prompt " << b << ", temperature " << rule.temperature;
      const int64_t C = alone.ids.size(1);
      EXPECT_TRUE(together.ids.narrow(0, rows, 2).narrow(1, 0, C).equal(alone.ids))
          << "prompt " << b << ", temperature " << rule.temperature << "\n"
          << together.ids.narrow(0, rows, 2) << "\n"
          << alone.ids;
    }
  }
}

}  // namespace
}  // namespace tightfit
