// The hybrid predict/correct schedule: its dynamics model learns real
// dynamics and distrusts noise; a run goes through all four phases and skips
// backward passes; the divergence guard rolls back an injected blow-up; and a
// run resumed inside a predict run repeats the uninterrupted one.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "dynamics_model.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tf_hybrid::DynamicsModel;

// Feeds the model updates u_t (per unit lr) as a training step would.
void observe(DynamicsModel& m, at::Tensor& w, const at::Tensor& u) {
  auto& g = m.group("w", w);
  DynamicsModel::begin_measure(g, w);
  w.add_(u, 0.1);  // lr 0.1
  m.observe({&g}, m.end_measure(g, w, 0.1).unsqueeze(0));
}

TEST(HybridDynamicsModel, LearnsDecayingUpdatesAndPredictsThem) {
  at::manual_seed(1);
  DynamicsModel m(0.9, 0.9);
  at::Tensor w = at::randn({64, 32});
  const at::Tensor dir = at::randn({64, 32});
  // u_t = 0.8^t dir: the next update is 0.8 x the last.
  for (int t = 0; t < 40; ++t) observe(m, w, dir * std::pow(0.8, t));
  EXPECT_GT(m.confidence(), 0.95);
  auto& g = *m.find("w");
  const at::Tensor last = g.last.clone();
  const at::Tensor next = m.predict_next(g).clone();
  EXPECT_TRUE(at::allclose(next, last * 0.8, 1e-3, 1e-6))
      << "a=" << g.a << " b=" << g.b << " max err "
      << (next - last * 0.8).abs().max().item<double>();
}

TEST(HybridDynamicsModel, DistrustsUpdatesWithNoDynamics) {
  at::manual_seed(2);
  DynamicsModel m(0.9, 0.9);
  at::Tensor w = at::randn({64, 32});
  for (int t = 0; t < 40; ++t) observe(m, w, at::randn({64, 32}));
  EXPECT_LT(std::abs(m.confidence()), 0.3);
  EXPECT_TRUE(m.ready());
}

std::vector<json> read_metrics(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

class HybridTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  // A short cycle so a few dozen steps see every phase.
  std::string recipe(const std::string& out, int steps, const std::string& extra = "") {
    std::string r = test::tiny_recipe(corpus, out);
    r.replace(r.find("steps = 4"), 9, "steps = " + std::to_string(steps));
    const std::string standard = "[schedule]\nplugin = \"standard\"\nwarmup_steps = 2\n";
    r.replace(r.find(standard), standard.size(),
              "[schedule]\nplugin = \"hybrid\"\nwarmup_steps = 2\ndecay = \"constant\"\n"
              "warmup_full_steps = 6\nfull_steps = 4\nconfidence = 0.3\n"
              "max_predict_steps = 8\ncorrection_interval = 3\n" +
                  extra);
    return r;
  }
};

TEST_F(HybridTest, RunsAllFourPhasesAndSkipsBackwardPasses) {
  auto s = test::make_session(recipe((dir.path() / "a").string(), 60));
  const TrainSummary sum = s->train();
  const auto m = read_metrics(s->env().run_dir);
  ASSERT_EQ(m.size(), 60u);
  std::set<std::string> phases;
  int predicted = 0;
  for (const auto& r : m) {
    phases.insert(r["phase"].get<std::string>());
    ASSERT_TRUE(std::isfinite(r["loss"].get<double>())) << r.dump();
    if (r["phase"] == "predict") {
      ++predicted;
      EXPECT_EQ(r["backward_passes"], 0);
    } else {
      EXPECT_EQ(r["backward_passes"], 1);
    }
  }
  EXPECT_EQ(phases, (std::set<std::string>{"warmup", "full", "predict", "correct"}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(m[static_cast<size_t>(i)]["phase"], "warmup");
  EXPECT_GE(predicted, 15);
  EXPECT_EQ(sum.backward_passes, 60 - predicted);
  EXPECT_DOUBLE_EQ(m.back()["hybrid.backward_skipped"].get<double>(), predicted / 60.0);
  EXPECT_EQ(m.back()["hybrid.divergences"], 0);
  // No predicted step in a run longer than max_predict_steps, and a
  // correction at least every correction_interval predicted steps.
  int run = 0, since = 0;
  for (const auto& r : m) {
    if (r["phase"] == "predict") {
      EXPECT_LE(++run, 8);
      EXPECT_LE(++since, 3);
    } else {
      since = 0;
      if (r["phase"] != "correct") run = 0;
    }
  }
  double head = 0, tail = 0;
  for (size_t i = 0; i < 10; ++i) {
    head += sum.losses[i] / 10;
    tail += sum.losses[sum.losses.size() - 1 - i] / 10;
  }
  EXPECT_LT(tail, head - 0.2) << head << " -> " << tail;
}

TEST_F(HybridTest, RollsBackAnInjectedDivergence) {
  auto s =
      test::make_session(recipe((dir.path() / "b").string(), 40, "inject_divergence_at = 14\n"));
  s->train();
  const auto m = read_metrics(s->env().run_dir);
  ASSERT_EQ(m.size(), 40u);
  // The blown-up update is applied at a predicted step; the next step's loss
  // trips the guard.
  size_t caught = 0;
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i]["hybrid.divergences"] == 1) {
      caught = i;
      break;
    }
  std::string phases;
  for (const auto& r : m) phases += r["phase"].get<std::string>() + " " + r["loss"].dump() + "\n";
  ASSERT_GT(caught, 13u) << "no divergence caught:\n" << phases;
  EXPECT_EQ(m[caught - 1]["phase"], "predict");
  double mean = 0;
  for (size_t i = caught - 6; i < caught - 1; ++i) mean += m[i]["loss"].get<double>() / 5;
  const json& spike = m[caught]["loss"];
  EXPECT_TRUE(spike.is_null() || spike.get<double>() > 1.5 * mean) << spike << " vs " << mean;
  // Rolled back: the losses are back where they were, on full steps.
  for (size_t i = caught + 1; i < caught + 5; ++i) {
    EXPECT_EQ(m[i]["phase"], "full") << i;
    EXPECT_LT(m[i]["loss"].get<double>(), 1.2 * mean) << i;
  }
  EXPECT_EQ(m.back()["hybrid.divergences"], 1);
  EXPECT_EQ(m[caught]["hybrid.confidence"], 0.0);
}

TEST_F(HybridTest, ResumesInsideAPredictRunExactly) {
  const std::string out = (dir.path() / "c").string();
  auto run = [&](const std::string& where, bool resume, int64_t stop) {
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop;
    auto s = test::make_session(recipe(where, 40), o);
    TrainSummary sum = s->train();
    return std::make_pair(sum, read_metrics(s->env().run_dir));
  };
  const auto [full, metrics] = run(out + "/full", false, -1);
  // Stop after the second predicted step of a run (and a correction).
  int64_t split = -1;
  for (size_t i = 1; i + 1 < metrics.size(); ++i)
    if (i > 20 && metrics[i]["phase"] == "predict" && metrics[i - 1]["phase"] == "predict") {
      split = static_cast<int64_t>(i) + 1;
      break;
    }
  ASSERT_GT(split, 0);
  run(out + "/split", false, split);
  const auto rest = run(out + "/split", true, -1);
  ASSERT_EQ(rest.first.losses.size(), static_cast<size_t>(40 - split));
  for (size_t i = 0; i < rest.first.losses.size(); ++i)
    EXPECT_EQ(rest.first.losses[i], full.losses[static_cast<size_t>(split) + i]) << i;
  int64_t backward_before_split = 0;
  for (int64_t i = 0; i < split; ++i)
    backward_before_split += metrics[static_cast<size_t>(i)]["backward_passes"].get<int64_t>();
  EXPECT_EQ(backward_before_split + rest.first.backward_passes, full.backward_passes);
}

}  // namespace
}  // namespace tightfit
