// Crash safety: `tightfit run` killed with SIGKILL at random moments after
// it made progress — most of a step here is the checkpoint save (one after
// every step) — never
// leaves a partial checkpoint where a complete one is expected. After every
// kill the newest checkpoint in the manifest loads, the step never goes
// back, and `--resume` finishes the run — and every step run after a kill
// has the loss the uninterrupted run has at that step, bit for bit. 10
// kills by default; TIGHTFIT_LONG_TESTS=1 makes it 50.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <thread>

#include "json_input.hpp"
#include "spawn_run.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

// Starts `tightfit run <recipe> --resume -q`, output to `log`.
pid_t start_run(const std::string& recipe, const std::string& log) {
  return test::start_tightfit({"run", recipe, "--resume", "-q"}, log);
}

// Every loss metrics.jsonl records, as (step, loss) in the order written (a
// line cut short by a kill is skipped).
std::vector<std::pair<int64_t, double>> logged_losses(const fs::path& metrics) {
  std::vector<std::pair<int64_t, double>> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    try {
      const nlohmann::json j = parse_json(line, metrics.string());
      if (j.contains("loss") && j["loss"].is_number())
        out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
    } catch (const std::exception&) {
    }
  }
  return out;
}

// The newest checkpoint the manifest lists (its step), or -1.
int64_t newest_in_manifest(const fs::path& checkpoints) {
  std::ifstream in(checkpoints / "manifest.json");
  if (!in) return -1;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.rfind("step-");
  return at == std::string::npos ? -1 : std::stoll(text.substr(at + 5, 8));
}

TEST(CrashSafety, KilledRunsAlwaysResumeFromACompleteCheckpoint) {
  const char* long_mode = std::getenv("TIGHTFIT_LONG_TESTS");
  const int kills = long_mode && *long_mode && std::string(long_mode) != "0" ? 50 : 10;
  test::TempDir dir;
  std::string text = test::tiny_recipe(test::write_corpus(dir), dir.str() + "/runs", "",
                                       "[save]\nevery = 1\nkeep_last = 2\n");
  // Enough steps that no run finishes before its kill: a run is killed at
  // most 150 ms (about 5 steps) after its first new save, so the 10 kills
  // use 10-60 steps. (60 a kill made the uninterrupted run and the final
  // resume, each a save a step, two of this test's 138 s.)
  const int64_t steps = 15 * kills;
  text.replace(text.find("steps = 4"), 9, "steps = " + std::to_string(steps));
  const std::string recipe = test::write_file(dir, "r.toml", text);
  const std::string log = dir.str() + "/run.log";
  const fs::path checkpoints = dir.path() / "runs" / "t" / "checkpoints";

  // The run uninterrupted, for its losses step by step.
  test::TempDir ref_dir;
  {
    std::string ref_text = text;
    ref_text.replace(ref_text.find(dir.str() + "/runs"), dir.str().size() + 5,
                     ref_dir.str() + "/runs");
    const std::string ref_recipe = test::write_file(ref_dir, "r.toml", ref_text);
    std::string out;
    ASSERT_EQ(test::run_tightfit("run " + ref_recipe + " -q", &out), 0) << out;
  }
  std::map<int64_t, double> reference;
  for (const auto& [step, loss] : logged_losses(ref_dir.path() / "runs" / "t" / "metrics.jsonl"))
    reference[step] = loss;
  ASSERT_EQ(reference.size(), static_cast<size_t>(steps));

  std::mt19937 rng(20261122);
  std::uniform_int_distribution<int> delay_ms(0, 150);  // a step and its save: ~30 ms
  int64_t last = -1;
  int killed_with_progress = 0, interrupted_saves = 0, signaled = 0;
  // Kills that landed after a step's loss was logged and before its save:
  // the resumed run runs that step again (and must log the same loss).
  int logged_unsaved = 0;
  const fs::path metrics = dir.path() / "runs" / "t" / "metrics.jsonl";
  std::error_code ec;
  for (int i = 0; i < kills; ++i) {
    const pid_t pid = start_run(recipe, log);
    ASSERT_GT(pid, 0);
    // Once this run has saved something new, at a random moment after:
    // inside a step, a save, or the rotation of old checkpoints.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (newest_in_manifest(checkpoints) <= last && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFSIGNALED(status)) continue;  // it finished first (a loaded machine): nothing to check
    ++signaled;

    // A save cut short leaves its temporary folder behind.
    for (const auto& e : fs::directory_iterator(checkpoints, ec))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) {
        ++interrupted_saves;
        break;
      }
    // The newest complete checkpoint is the manifest's newest, and it loads.
    const int64_t listed = newest_in_manifest(checkpoints);
    int64_t logged = -1;
    for (const auto& entry : logged_losses(metrics)) logged = std::max(logged, entry.first);
    if (logged > listed) ++logged_unsaved;
    if (listed < 0) continue;  // killed before its first save
    SessionOptions o;
    o.resume = true;
    o.stop_after_steps = 0;
    std::unique_ptr<Session> s;
    ASSERT_NO_THROW(s = test::make_session(text, o, (dir.path() / "r.toml").string()))
        << "kill " << i;
    EXPECT_EQ(s->step(), listed) << "kill " << i << ": the newest listed checkpoint did not load";
    EXPECT_GE(s->step(), last) << "kill " << i << ": a saved step was lost";
    if (s->step() > last) ++killed_with_progress;
    last = s->step();
  }
  // Every run that was killed had saved something new first; on a loaded
  // machine a run may finish before its kill, which proves nothing either way.
  EXPECT_EQ(killed_with_progress, signaled) << "every run was killed after it saved something new";
  EXPECT_GE(signaled, kills / 2) << "too few runs were killed to prove anything";
  std::cout << kills << " kills, " << interrupted_saves << " of them inside a save, "
            << killed_with_progress << " after progress; no checkpoint lost or corrupt\n";
  RecordProperty("interrupted_saves", interrupted_saves);

  // Uninterrupted, it finishes from where it was.
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --resume -q", &out), 0) << out;
  const std::string total = std::to_string(steps);
  EXPECT_NE(out.find("-> " + total + " of " + total), std::string::npos) << out;
  EXPECT_EQ(newest_in_manifest(checkpoints), steps);
  // Every step has one row, in order — a step run again after a kill that
  // came between its log and its save replaces the killed run's row — and
  // every row has the uninterrupted run's loss.
  int64_t compared = 0, mismatched = 0;
  for (const auto& [step, loss] : logged_losses(dir.path() / "runs" / "t" / "metrics.jsonl")) {
    ++compared;
    EXPECT_EQ(step, compared) << "metrics.jsonl's rows are not steps 1.." << steps << " once each";
    if (loss != reference[step] && ++mismatched <= 5)
      ADD_FAILURE() << "step " << step << ": loss " << loss << " after resuming, "
                    << reference[step] << " uninterrupted";
  }
  EXPECT_EQ(mismatched, 0);
  EXPECT_EQ(compared, steps);
  std::cout << compared << " logged losses equal the uninterrupted run's, one row a step; "
            << logged_unsaved << " kills came between a step's log and its save, and those steps "
            << "were run again\n";
  // The folders of the saves that were cut short are gone after it.
  for (const auto& e : fs::directory_iterator(checkpoints))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// One run per run folder: while a run trains, a second `run --resume` on
// its folder is refused naming the first one's pid, and metrics.jsonl holds
// only the first run's rows; once the first is killed (SIGKILL: no cleanup
// runs), the lock is gone with it and `--resume` trains again.
TEST(CrashSafety, OneRunPerFolderAndTheLockDiesWithItsProcess) {
  test::TempDir dir;
  std::string text = test::tiny_recipe(test::write_corpus(dir), dir.str() + "/runs", "",
                                       "[save]\nevery = 1\nkeep_last = 2\n");
  text.replace(text.find("steps = 4"), 9, "steps = 100000");
  const std::string recipe = test::write_file(dir, "r.toml", text);
  const fs::path run_dir = dir.path() / "runs" / "t";
  const pid_t first = start_run(recipe, dir.str() + "/first.log");
  ASSERT_GT(first, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (newest_in_manifest(run_dir / "checkpoints") < 1 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(newest_in_manifest(run_dir / "checkpoints"), 1) << "the first run never saved";

  std::string out;
  const int rc = test::run_tightfit("run " + recipe + " --resume -q", &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("in use by another tightfit run (pid " + std::to_string(first) + ")"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(run_dir.string()), std::string::npos) << out;
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  int status = 0;
  ::waitpid(first, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  // Every row in metrics.jsonl is the first run's: steps counting up from 1.
  int64_t expect = 1;
  for (const auto& [step, loss] : logged_losses(run_dir / "metrics.jsonl")) {
    EXPECT_EQ(step, expect) << "a row not from the first run";
    expect = step + 1;
  }

  // The lock died with the killed run: a resumed run trains on.
  std::string t2 = text;
  t2.replace(t2.find("steps = 100000"), 14, "steps = " + std::to_string(expect + 1));
  test::write_file(dir, "r.toml", t2);
  EXPECT_EQ(test::run_tightfit("run " + recipe + " --resume -q", &out), 0) << out;
}

}  // namespace
}  // namespace tightfit
