// The CPUs a run may use and how busy other processes keep them: the facts
// [run] threads = 0 and [run] adapt_threads choose LibTorch's thread count
// from (kernel/train/cpu_threads.hpp). bench/run contention measures what
// the choice does to a step beside busy processes.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "cpu_load.hpp"
#include "cpu_threads.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

// The kernel's own parallel loops (NF4 codes, GGUF blocks, initial values)
// run on LibTorch's threads: compiled without OpenMP, at::parallel_for ran
// each on the calling thread alone (a 7B model's set-up on one of two cores).
TEST(CpuThreads, TheKernelsParallelLoopsRunOnLibTorchsThreads) {
  const int saved = at::get_num_threads();
  at::set_num_threads(2);
  EXPECT_EQ(parallel_for_threads(), 2);
  at::set_num_threads(1);
  EXPECT_EQ(parallel_for_threads(), 1);
  at::set_num_threads(saved);
}

// Idle OpenMP threads sleep rather than spin (hosts/startup/openmp_waits.cpp)
// in the host and in the test executables, and a value the user gave is
// kept. libgomp says what it read when OMP_DISPLAY_ENV=verbose: a spin count
// of 0 is the passive policy (unset, it spins 300000 turns and still prints
// PASSIVE).
TEST(CpuThreads, IdleOpenmpThreadsSleepUnlessTheUserSaysOtherwise) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  for (const std::string& program :
       {std::string(TIGHTFIT_BINARY) + " --version", self + " --gtest_list_tests"}) {
    std::string out;
    ASSERT_EQ(test::run_command(
                  "env -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=verbose " + program + " 2>&1", &out),
              0)
        << out;
    EXPECT_NE(out.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << program << "\n" << out;
    ASSERT_EQ(test::run_command(
                  "OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=verbose " + program + " 2>&1", &out),
              0)
        << out;
    EXPECT_NE(out.find("OMP_WAIT_POLICY = 'ACTIVE'"), std::string::npos) << program << "\n" << out;
    EXPECT_EQ(out.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << program << "\n" << out;
  }
  // This executable is one of them: its variable is set by now.
  const char* now = std::getenv("OMP_WAIT_POLICY");
  ASSERT_NE(now, nullptr);
}

// A run whose threads follow the machine's load ([run] adapt_threads) spins
// briefly instead of sleeping: beside a busy process it trains on one thread,
// and on a quiet machine a decode's small regions then wake no futex. The
// executable starts itself again once for it (the count is read as libgomp
// loads, so OMP_DISPLAY_ENV shows both images); a policy the user gave, and
// a run with a fixed thread count, keep the passive waits.
TEST(CpuThreads, ARunWhoseThreadsFollowTheLoadSpinsBriefly) {
  test::TempDir dir;
  const std::string recipe =
      test::write_file(dir, "r.toml", test::tiny_recipe(test::write_corpus(dir), dir.str()));
  auto dry_run = [&](const std::string& env, const std::string& sets, std::string* out) {
    return test::run_command(
        "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u TIGHTFIT_OPENMP_WAITS "
        "OMP_DISPLAY_ENV=verbose " +
            env + " " + TIGHTFIT_BINARY + " run " + recipe + " --dry-run " + sets + " 2>&1",
        out);
  };
  std::string out;
  ASSERT_EQ(dry_run("", "--set run.adapt_threads=true", &out), 0) << out;
  EXPECT_NE(out.find("GOMP_SPINCOUNT = '3000'"), std::string::npos) << out;
  EXPECT_NE(out.find("valid"), std::string::npos) << out;
  ASSERT_EQ(dry_run("", "", &out), 0) << out;
  EXPECT_EQ(out.find("GOMP_SPINCOUNT = '3000'"), std::string::npos) << out;
  EXPECT_NE(out.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << out;
  ASSERT_EQ(dry_run("OMP_WAIT_POLICY=passive", "--set run.adapt_threads=true", &out), 0) << out;
  EXPECT_EQ(out.find("GOMP_SPINCOUNT = '3000'"), std::string::npos) << out;
  ASSERT_EQ(dry_run("GOMP_SPINCOUNT=20", "--set run.adapt_threads=true", &out), 0) << out;
  EXPECT_EQ(out.find("GOMP_SPINCOUNT = '3000'"), std::string::npos) << out;
  EXPECT_NE(out.find("GOMP_SPINCOUNT = '20'"), std::string::npos) << out;
}

TEST(CpuThreads, ACpuCountsAsTakenFromThreeQuartersBusy) {
  EXPECT_EQ(threads_beside(2, 0.0), 2);
  EXPECT_EQ(threads_beside(2, 0.5), 2);  // shared now and then: still a thread
  EXPECT_EQ(threads_beside(2, 0.8), 1);
  EXPECT_EQ(threads_beside(2, 1.9), 1);  // never fewer than one
  EXPECT_EQ(threads_beside(8, 2.76), 5);
  EXPECT_EQ(threads_beside(1, 5.0), 1);
}

TEST(CpuThreads, UsableCpusAreTheAffinitySetCappedByTheQuota) {
  const UsableCpus u = usable_cpus();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_EQ(static_cast<int>(u.ids.size()), CPU_COUNT(&set));
  EXPECT_GE(u.count, 1);
  EXPECT_LE(u.count, static_cast<int>(u.ids.size()));
  if (u.quota > 0) {
    EXPECT_LE(u.count, static_cast<int>(u.quota) + 1);
  }
  EXPECT_NE(u.describe().find(std::to_string(u.count) + " CPU"), std::string::npos) << u.describe();
}

// A child process that spins for a second shows as about one CPU busy;
// this process's own spinning thread never counts as another's.
TEST(CpuThreads, LoadCountsOtherProcessesNotThisOne) {
  const UsableCpus u = usable_cpus();
  CpuLoad load(u.ids);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    volatile uint64_t x = 0;
    while (std::chrono::steady_clock::now() < end) x = x + 1;
    _exit(0);
  }
  (void)load.others_busy();  // from here
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  const std::optional<double> busy = load.others_busy();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(busy.has_value());
  EXPECT_GE(*busy, 0.5) << "a spinning child process";
  EXPECT_LE(*busy, static_cast<double>(u.ids.size()) + 1e-9);
}

TEST(CpuThreads, AFixedCountIsSetAndSaid) {
  const int before = at::get_num_threads();
  {
    CpuThreads t(3, /*adapt=*/true, [](tf_log_level, const std::string&) {});
    EXPECT_EQ(at::get_num_threads(), 3);
    EXPECT_EQ(t.threads(), 3);
    // A fixed count does not adapt (adapt_threads is for threads = 0).
    EXPECT_NE(t.describe().find("3 threads"), std::string::npos) << t.describe();
    EXPECT_NE(t.describe().find("[run] threads"), std::string::npos) << t.describe();
    EXPECT_EQ(t.describe().find("following"), std::string::npos) << t.describe();
  }
  {
    CpuThreads t(0, /*adapt=*/false, [](tf_log_level, const std::string&) {});
    EXPECT_EQ(at::get_num_threads(), usable_cpus().count);
  }
  at::set_num_threads(before);
}

// A recipe that both fixes the count and asks it to follow the load is
// refused by name, not half done.
TEST(CpuThreads, AFixedCountThatShouldAdaptIsRefused) {
  test::TempDir dir;
  std::string text = test::tiny_recipe(test::write_corpus(dir), dir.str() + "/out");
  text.replace(text.find("log_every = 1000"), 16,
               "log_every = 1000\nthreads = 2\nadapt_threads = true");
  const std::string error = test::recipe_error(text);
  EXPECT_NE(error.find("adapt_threads = true"), std::string::npos) << error;
  EXPECT_NE(error.find("threads = 2"), std::string::npos) << error;
}

}  // namespace
}  // namespace tightfit
