// Ctrl-C (SIGINT) or SIGTERM during `tightfit run` stops at the next step
// boundary, saves a checkpoint, says where and how to resume, and exits 130
// (143); the resumed run takes the uninterrupted run's steps with the same
// losses bit for bit. A second Ctrl-C stops at once. (Issue 64.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "json_input.hpp"
#include "spawn_run.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

// Starts `tightfit run <recipe> -q`, its output to `log`.
pid_t start_run(const std::string& recipe, const std::string& log) {
  return test::start_tightfit({"run", recipe, "-q"}, log, /*truncate=*/true);
}

// (step, loss) of every row metrics.jsonl holds.
std::map<int64_t, double> losses(const fs::path& metrics) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    try {
      const nlohmann::json j = parse_json(line, metrics.string());
      if (j.contains("loss") && j["loss"].is_number())
        out[j["step"].get<int64_t>()] = j["loss"].get<double>();
    } catch (const std::exception&) {
    }
  }
  return out;
}

// Waits until the run has logged `steps` steps (or 60 s passed).
void wait_for_steps(const fs::path& metrics, size_t steps) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (losses(metrics).size() < steps && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class Interrupt : public ::testing::Test {
 protected:
  test::TempDir dir;
  // Saves only at its end: an interrupt loses everything without its own save.
  std::string recipe_in(const std::string& out) {
    std::string text = test::tiny_recipe(test::write_corpus(dir), out);
    text.replace(text.find("steps = 4"), 9, "steps = 100");
    return test::write_file(dir, "r" + std::to_string(++recipes_) + ".toml", text);
  }
  int recipes_ = 0;
};

TEST_F(Interrupt, CtrlCSavesAtTheNextStepAndTheResumeTakesTheSameSteps) {
  const std::string reference_recipe = recipe_in(dir.str() + "/reference");
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + reference_recipe + " -q", &out), 0) << out;
  const auto reference = losses(dir.path() / "reference" / "t" / "metrics.jsonl");
  ASSERT_EQ(reference.size(), 100u);

  const std::string recipe = recipe_in(dir.str() + "/runs");
  const fs::path metrics = dir.path() / "runs" / "t" / "metrics.jsonl";
  const std::string log = dir.str() + "/run.log";
  const pid_t pid = start_run(recipe, log);
  ASSERT_GT(pid, 0);
  wait_for_steps(metrics, 3);
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string said = text_of(log);
  ASSERT_TRUE(WIFEXITED(status)) << said;
  EXPECT_EQ(WEXITSTATUS(status), 130) << said;
  const auto before = losses(metrics);
  ASSERT_GE(before.size(), 3u);
  ASSERT_LT(before.size(), 100u) << "the run finished before the signal";
  const int64_t stopped_at = before.rbegin()->first;
  char step_name[32];
  std::snprintf(step_name, sizeof step_name, "step-%08lld", static_cast<long long>(stopped_at));
  const fs::path checkpoint = dir.path() / "runs" / "t" / "checkpoints" / step_name;
  EXPECT_TRUE(fs::exists(checkpoint)) << said;
  EXPECT_NE(said.find("stopped by Ctrl-C after step " + std::to_string(stopped_at) +
                      " of 100; saved " + checkpoint.string()),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("continue with: tightfit run " + recipe + " -q --resume"), std::string::npos)
      << said;

  ASSERT_EQ(test::run_tightfit("run " + recipe + " -q --resume", &out), 0) << out;
  const auto all = losses(metrics);
  ASSERT_EQ(all.size(), 100u);
  for (const auto& [step, loss] : reference) EXPECT_EQ(all.at(step), loss) << "step " << step;
}

// SIGTERM (a scheduler's stop) is the same stop and save, exit 143.
TEST_F(Interrupt, SigtermSavesAsCtrlCDoes) {
  const std::string recipe = recipe_in(dir.str() + "/runs");
  const fs::path metrics = dir.path() / "runs" / "t" / "metrics.jsonl";
  const std::string log = dir.str() + "/term.log";
  const pid_t pid = start_run(recipe, log);
  wait_for_steps(metrics, 2);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string said = text_of(log);
  ASSERT_TRUE(WIFEXITED(status)) << said;
  EXPECT_EQ(WEXITSTATUS(status), 143) << said;
  EXPECT_NE(said.find("stopped by SIGTERM after step "), std::string::npos) << said;
  EXPECT_TRUE(fs::exists(dir.path() / "runs" / "t" / "checkpoints" / "manifest.json")) << said;
}

// A second Ctrl-C does not wait for the step: the process ends by the signal.
TEST_F(Interrupt, ASecondCtrlCStopsAtOnce) {
  const std::string recipe = recipe_in(dir.str() + "/runs");
  const fs::path metrics = dir.path() / "runs" / "t" / "metrics.jsonl";
  const pid_t pid = start_run(recipe, dir.str() + "/twice.log");
  wait_for_steps(metrics, 2);
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  // Once the first is taken (two pending SIGINTs would be one): its words.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (text_of(dir.str() + "/twice.log").find("Ctrl-C again") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const std::string said = text_of(dir.str() + "/twice.log");
  // Ended by SIGINT itself: a millisecond after the first was taken, its
  // step, save and exit are not done (and once the loop is left, a signal
  // ends the process too).
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status) << ": " << said;
  EXPECT_EQ(WTERMSIG(status), SIGINT) << said;
  EXPECT_NE(said.find("Ctrl-C again stops at once"), std::string::npos) << said;
}

}  // namespace
}  // namespace tightfit
