// [run] profile_ops: each step's time inside LibTorch operators, which the
// benchmarks subtract from the step's wall time to get the host's overhead.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "op_timer.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

TEST(OpTimer, CountsOutermostOpsOnlyAndNotTheTimeBetweenThem) {
  const at::Tensor a = at::randn({256, 256});
  OpTimer timer;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) (void)at::mm(a, a);
  const double ops = timer.seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // outside any op
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(ops, 0.0);
  EXPECT_DOUBLE_EQ(timer.seconds(), ops);  // nothing ran while sleeping
  EXPECT_LT(ops, wall - 0.045);
  EXPECT_THROW(OpTimer second, std::logic_error);
}

TEST(OpTimer, ProfiledRunRecordsOpAndStepTimes) {
  test::TempDir dir;
  std::string r = test::tiny_recipe(test::write_corpus(dir), dir.str());
  r.replace(r.find("log_every = 1000"), 16, "log_every = 1000\nprofile_ops = true");
  const TrainSummary sum = test::make_session(r)->train();
  std::ifstream in(sum.metrics_path);
  int rows = 0;
  for (std::string line; std::getline(in, line); ++rows) {
    const auto rec = nlohmann::json::parse(line);
    ASSERT_TRUE(rec.contains("op_s")) << line;
    const double op = rec["op_s"].get<double>(), step = rec["step_s"].get<double>();
    EXPECT_GT(op, 0.0);
    EXPECT_LE(op, step);
  }
  EXPECT_EQ(rows, 4);
  // profile.json: the same time by operator, largest first; the matmuls of
  // the forward are among them.
  std::ifstream pf(sum.run_dir + "/profile.json");
  ASSERT_TRUE(pf.good());
  const auto profile = nlohmann::json::parse(pf);
  double total = 0, previous = 1e30;
  bool linear = false;
  for (const auto& op : profile["ops"]) {
    const double s = op["seconds"].get<double>();
    EXPECT_LE(s, previous);
    previous = s;
    total += s;
    linear = linear || op["op"].get<std::string>() == "aten::linear";
  }
  EXPECT_TRUE(linear) << profile.dump();
  EXPECT_NEAR(total, profile["inside_ops_s"].get<double>(), 1e-6);
  EXPECT_LE(total, profile["wall_s"].get<double>());
}

}  // namespace
}  // namespace tightfit
