// The plugin SDK as an outside project sees it: install tightfit to a
// temporary prefix, build examples/third-party-strategy,
// examples/preference-schedule and examples/reward-plugin against that prefix alone
// (find_package(tightfit), tightfit_add_plugin), and run their recipes with
// the installed host.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

std::string quoted(const fs::path& p) {
  return "'" + p.string() + "'";
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Losses and the last line's peak activations from a run's metrics.jsonl.
struct RunMetrics {
  std::vector<std::string> losses;  // as written: compared exactly
  double peak_activations = 0;
};
RunMetrics metrics_of(const fs::path& out_dir) {
  RunMetrics m;
  for (const auto& e : fs::recursive_directory_iterator(out_dir)) {
    if (e.path().filename() != "metrics.jsonl") continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) {
      const size_t at = line.find("\"loss\":");
      if (at == std::string::npos) continue;
      m.losses.push_back(line.substr(at + 7, line.find(',', at) - at - 7));
      const size_t act = line.find("\"peak_activations\":");
      if (act != std::string::npos) m.peak_activations = std::stod(line.substr(act + 19));
    }
  }
  return m;
}

// tightfit installed once for the suite, in a temporary prefix.
class SdkInstall : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    install_rc_ =
        test::run_command(std::string(TIGHTFIT_CMAKE) + " --install " + quoted(TIGHTFIT_BUILD_DIR) +
                              " --prefix " + quoted(prefix()),
                          &install_out_);
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override { ASSERT_EQ(install_rc_, 0) << install_out_; }
  static fs::path prefix() { return dir_->path() / "prefix"; }
  static std::string host() { return (prefix() / "bin" / "tightfit").string(); }
  // Configures and builds examples/NAME with the installed prefix only:
  // nothing of this tree is on the paths. Returns the build folder.
  static fs::path build_example(const std::string& name, std::string* out) {
    const fs::path example = fs::path(TIGHTFIT_SOURCE_DIR) / "examples" / name;
    const fs::path build = dir_->path() / (name + "-build");
    if (test::run_command(std::string(TIGHTFIT_CMAKE) + " -S " + quoted(example) + " -B " +
                              quoted(build) + " -G " + quoted(TIGHTFIT_CMAKE_GENERATOR) +
                              " -DCMAKE_PREFIX_PATH=" + quoted(prefix()) +
                              " -DCMAKE_BUILD_TYPE=RelWithDebInfo",
                          out) != 0)
      return {};
    if (test::run_command(std::string(TIGHTFIT_CMAKE) + " --build " + quoted(build), out) != 0)
      return {};
    return build;
  }
  static test::TempDir* dir_;
  static int install_rc_;
  static std::string install_out_;
};
test::TempDir* SdkInstall::dir_ = nullptr;
int SdkInstall::install_rc_ = -1;
std::string SdkInstall::install_out_;

TEST_F(SdkInstall, OutOfTreePluginBuildsAgainstTheInstalledSdkAndRuns) {
  test::TempDir dir;
  const fs::path prefix = SdkInstall::prefix();
  std::string out;
  for (const char* installed :
       {"bin/tightfit", "include/tightfit/plugin_api.h", "include/tightfit/plugin_sdk.hpp",
        "lib/cmake/tightfit/tightfitConfig.cmake", "lib/tightfit/plugins/libtightfit_gpt2.so"})
    EXPECT_TRUE(fs::exists(prefix / installed)) << installed;

  const fs::path example = fs::path(TIGHTFIT_SOURCE_DIR) / "examples" / "third-party-strategy";
  const fs::path build = build_example("third-party-strategy", &out);
  ASSERT_FALSE(build.empty()) << out;
  const fs::path plugin = build / "libtightfit_selective_checkpoint.so";
  ASSERT_TRUE(fs::exists(plugin)) << out;

  // The installed host validates it: ABI, LibTorch, hooks.
  const std::string host = SdkInstall::host();
  ASSERT_EQ(test::run_command(host + " plugins check " + quoted(plugin), &out), 0) << out;
  EXPECT_NE(out.find("ABI " + std::to_string(TF_ABI_VERSION_MAJOR) + "." +
                     std::to_string(TF_ABI_VERSION_MINOR)),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("configure, estimate_memory"), std::string::npos) << out;

  // The example's recipe, shortened, with the plugin and without it: the
  // same losses bit for bit (recomputation is exact), fewer activations.
  const std::string recipe = read(example / "recipe.toml");
  const fs::path with = dir.path() / "with.toml", plain = dir.path() / "plain.toml";
  std::ofstream(with) << recipe;
  std::ofstream(plain) << recipe.substr(0, recipe.find("[[strategy]]"));
  const std::string env = "TIGHTFIT_PLUGIN_PATH=" + quoted(build) + " ";
  const std::string sets = " -q --set run.steps=4 --set run.log_every=1 --set run.out_dir=";
  ASSERT_EQ(
      test::run_command(
          env + host + " run " + quoted(with) + sets + quoted(dir.path() / "with-runs"), &out),
      0)
      << out;
  EXPECT_NE(out.find("[selective_checkpoint] recomputing 5 of 6 blocks"), std::string::npos) << out;
  ASSERT_EQ(
      test::run_command(
          env + host + " run " + quoted(plain) + sets + quoted(dir.path() / "plain-runs"), &out),
      0)
      << out;
  const RunMetrics a = metrics_of(dir.path() / "with-runs"),
                   b = metrics_of(dir.path() / "plain-runs");
  ASSERT_EQ(a.losses.size(), 4u);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_LT(a.peak_activations, 0.5 * b.peak_activations);

  // `tightfit fit` searches it as it declares (ABI 1.23), beside the
  // built-in strategies (left out here): its two values are stacks fit
  // plans and lists, under the labels it gave them.
  ASSERT_EQ(test::run_command(
                "(" + env + host + " fit " + quoted(plain) +
                    " --budget 64GiB --top 10 --json --without "
                    "lora,quantize,adamw8,precision,checkpoint,offload,fused_update,accumulate"
                    " --out " +
                    quoted(dir.path() / "fit.toml") + " 2>/dev/null)",
                &out),
            0)
      << out;
  const nlohmann::json fit = nlohmann::json::parse(out);
  std::vector<std::string> stacks;
  for (const nlohmann::json& b : fit["best"]) stacks.push_back(b["stack"].get<std::string>());
  EXPECT_EQ(fit["stacks"].get<int>(), 3) << out;  // plain, block 0, blocks 0 and 1
  for (const char* stack : {"plain", "recompute block 0", "recompute blocks 0, 1"})
    EXPECT_NE(std::find(stacks.begin(), stacks.end(), stack), stacks.end()) << stack << "\n" << out;
}

// The out-of-tree preference schedule: built against the installed SDK,
// checked by the installed host, and run on the real SmolLM2 model (which
// scripts/setup fetches) for four steps: the adapters start at B = 0, so the
// first loss is APO-zero's 1 - sigmoid(0) + sigmoid(0) = 1, and training
// moves the held-out loss below it.
TEST_F(SdkInstall, OutOfTreePreferenceScheduleBuildsAndTrains) {
  const fs::path example = fs::path(TIGHTFIT_SOURCE_DIR) / "examples" / "preference-schedule";
  ASSERT_TRUE(fs::is_regular_file(fs::path(TIGHTFIT_SOURCE_DIR) / ".cache" / "models" /
                                  "SmolLM2-135M-Instruct.Q4_1.gguf"))
      << "scripts/setup fetches the model";
  std::string out;
  const fs::path build = build_example("preference-schedule", &out);
  ASSERT_FALSE(build.empty()) << out;
  const fs::path plugin = build / "libtightfit_apo_zero.so";
  ASSERT_TRUE(fs::exists(plugin)) << out;
  ASSERT_EQ(test::run_command(host() + " plugins check " + quoted(plugin), &out), 0) << out;
  EXPECT_NE(out.find("apo_zero"), std::string::npos) << out;

  // The example's recipe from its own folder (its paths are relative to it),
  // its plugin found through TIGHTFIT_PLUGIN_PATH rather than ./build.
  test::TempDir runs;
  const std::string cmd = "TIGHTFIT_PLUGIN_PATH=" + quoted(build) + " " + host() + " run " +
                          quoted(example / "recipe.toml") +
                          " --set run.steps=4 --set run.log_every=1 --set optimizer.lr=5e-4 "
                          "--set 'run.plugin_paths=[]' --set run.out_dir=" +
                          quoted(runs.path());
  ASSERT_EQ(test::run_command(cmd, &out), 0) << out;
  const RunMetrics m = metrics_of(runs.path());
  ASSERT_EQ(m.losses.size(), 4u) << out;
  EXPECT_NEAR(std::stod(m.losses[0]), 1.0, 1e-6) << out;
  std::smatch val;
  ASSERT_TRUE(std::regex_search(out, val, std::regex("final train, ([0-9.]+) validation"))) << out;
  EXPECT_LT(std::stod(val[1]), 1.0) << out;
}

// examples/reward-plugin: a reward built against the installed SDK, loaded
// by the installed host beside a built-in reward; two GRPO steps log its
// scores under its name.
TEST_F(SdkInstall, OutOfTreeRewardBuildsAndTrains) {
  const fs::path example = fs::path(TIGHTFIT_SOURCE_DIR) / "examples" / "reward-plugin";
  ASSERT_TRUE(fs::is_regular_file(fs::path(TIGHTFIT_SOURCE_DIR) / ".cache" / "models" /
                                  "SmolLM2-135M-Instruct.Q4_1.gguf"))
      << "scripts/setup fetches the model";
  std::string out;
  const fs::path build = build_example("reward-plugin", &out);
  ASSERT_FALSE(build.empty()) << out;
  const fs::path plugin = build / "libtightfit_keywords.so";
  ASSERT_TRUE(fs::exists(plugin)) << out;
  ASSERT_EQ(test::run_command(host() + " plugins check " + quoted(plugin), &out), 0) << out;
  EXPECT_NE(out.find("reward"), std::string::npos) << out;
  test::TempDir runs;
  const std::string cmd = "TIGHTFIT_PLUGIN_PATH=" + quoted(build) + " " + host() + " run " +
                          quoted(example / "recipe.toml") +
                          " --set run.steps=2 --set 'run.plugin_paths=[]' --set "
                          "schedule.max_completion_length=8 --set run.out_dir=" +
                          quoted(runs.path());
  ASSERT_EQ(test::run_command(cmd, &out), 0) << out;
  std::string metrics;
  for (const auto& e : fs::recursive_directory_iterator(runs.path()))
    if (e.path().filename() == "metrics.jsonl") metrics = read(e.path());
  EXPECT_NE(metrics.find("\"grpo.rewards/keywords/mean\""), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\"grpo.rewards/length/mean\""), std::string::npos) << metrics;
}

}  // namespace
}  // namespace tightfit
