// The plugin SDK as an outside project sees it: install tightfit to a
// temporary prefix, build examples/third-party-strategy against that prefix
// alone (find_package(tightfit), tightfit_add_plugin), and run its recipe with
// the installed host.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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

TEST(SdkInstall, OutOfTreePluginBuildsAgainstTheInstalledSdkAndRuns) {
  test::TempDir dir;
  const fs::path prefix = dir.path() / "prefix", build = dir.path() / "example-build";
  std::string out;
  ASSERT_EQ(test::run_command(std::string(TIGHTFIT_CMAKE) + " --install " +
                                  quoted(TIGHTFIT_BUILD_DIR) + " --prefix " + quoted(prefix),
                              &out),
            0)
      << out;
  for (const char* installed :
       {"bin/tightfit", "include/tightfit/plugin_api.h", "include/tightfit/plugin_sdk.hpp",
        "lib/cmake/tightfit/tightfitConfig.cmake", "lib/tightfit/plugins/libtightfit_gpt2.so"})
    EXPECT_TRUE(fs::exists(prefix / installed)) << installed;

  // Configured with the installed prefix only: nothing of this tree is on the paths.
  const fs::path example = fs::path(TIGHTFIT_SOURCE_DIR) / "examples" / "third-party-strategy";
  ASSERT_EQ(test::run_command(std::string(TIGHTFIT_CMAKE) + " -S " + quoted(example) + " -B " +
                                  quoted(build) + " -G " + quoted(TIGHTFIT_CMAKE_GENERATOR) +
                                  " -DCMAKE_PREFIX_PATH=" + quoted(prefix) +
                                  " -DCMAKE_BUILD_TYPE=RelWithDebInfo",
                              &out),
            0)
      << out;
  ASSERT_EQ(test::run_command(std::string(TIGHTFIT_CMAKE) + " --build " + quoted(build), &out), 0)
      << out;
  const fs::path plugin = build / "libtightfit_selective_checkpoint.so";
  ASSERT_TRUE(fs::exists(plugin)) << out;

  // The installed host validates it: ABI, LibTorch, hooks.
  const std::string host = (prefix / "bin" / "tightfit").string();
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
}

}  // namespace
}  // namespace tightfit
