// Plugins are code (issue 21): discovery learns what a library is in a
// child process, so a library that crashes or hangs when loaded fails its
// scan instead of taking the host down, and none of its code runs in the
// host before a recipe uses it; a pin is checked on the bytes that are
// loaded, before they run; scans are cached by file identity; plugins come
// only from absolute folders that no one else can write.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "plugin_loader.hpp"
#include "plugin_scan.hpp"
#include "sha256.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

const std::string kOnLoad = std::string(TIGHTFIT_FIXTURE_DIR) + "/on_load/";

// Sets an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Each test gets its own plugin folder (mode 0700), scan cache and load
// log; a library copied under a new name is a new file to the dynamic
// linker, so its load-time code runs again wherever it is loaded.
class PluginTrust : public ::testing::Test {
 protected:
  void SetUp() override { ::unsetenv("TIGHTFIT_FIXTURE_LOADED"); }
  std::string add(const std::string& fixture, const std::string& as) {
    const std::string to = plugins_.str() + "/" + as;
    fs::copy_file(kOnLoad + fixture + ".so", to);
    return to;
  }
  // How many times any process has loaded a fixture library (the scanner included).
  int loads() const {
    std::ifstream in(log_);
    int n = 0;
    for (std::string line; std::getline(in, line);) n += !line.empty();
    return n;
  }
  static bool has_problem(const PluginRegistry& reg, const std::string& a, const std::string& b) {
    for (const auto& p : reg.problems())
      if (p.find(a) != std::string::npos && p.find(b) != std::string::npos) return true;
    return false;
  }
  static std::string problems(const PluginRegistry& reg) {
    std::string all;
    for (const auto& p : reg.problems()) all += p + "\n";
    return all;
  }

  test::TempDir plugins_, cache_, scratch_;
  std::string log_ = scratch_.str() + "/loads.log";
  ScopedEnv cache_env_{"TIGHTFIT_CACHE_DIR", cache_.str()};
  ScopedEnv log_env_{"TIGHTFIT_FIXTURE_LOAD_LOG", log_};
  ScopedEnv timeout_env_{"TIGHTFIT_PLUGIN_SCAN_TIMEOUT", "8"};
};

TEST_F(PluginTrust, CrashingAndHangingLibrariesFailTheirScanNotTheHost) {
  const std::string crash = add("fixture_crashes_on_load", "a_crash.so");
  const std::string hang = add("fixture_hangs_on_load", "b_hang.so");
  const std::string good = add("fixture_loads_quietly", "c_good.so");
  PluginRegistry reg;
  reg.add_path(plugins_.str(), "TIGHTFIT_PLUGIN_PATH");
  EXPECT_TRUE(has_problem(reg, crash, "crashed while being loaded (signal 11")) << problems(reg);
  EXPECT_TRUE(has_problem(reg, hang, "did not finish loading within 8 s")) << problems(reg);
  // The library after them in the folder was scanned in a scanner of its own.
  const PluginInfo* info = reg.find_any("fixture_loads_quietly");
  ASSERT_NE(info, nullptr) << problems(reg);
  EXPECT_EQ(info->path, good);
  EXPECT_EQ(info->sha256, sha256_file_hex(good));
  EXPECT_EQ(info->hooks, std::vector<std::string>{"run_step"});
  // Their code ran in scanners only: this process has not loaded any of them.
  EXPECT_EQ(std::getenv("TIGHTFIT_FIXTURE_LOADED"), nullptr);
  EXPECT_EQ(loads(), 3);
  // Used by a recipe, the good one is loaded here.
  const LoadedPlugin& loaded = reg.find("fixture_loads_quietly", TF_PLUGIN_SCHEDULE);
  ASSERT_NE(std::getenv("TIGHTFIT_FIXTURE_LOADED"), nullptr);
  EXPECT_STREQ(std::getenv("TIGHTFIT_FIXTURE_LOADED"), "fixture_loads_quietly");
  EXPECT_NE(loaded.schedule(), nullptr);
  EXPECT_EQ(loaded.sha256, info->sha256);
}

// `plugins check` on a library that crashes when loaded reports it and
// exits with the plugin error code; tightfit itself does not crash.
TEST_F(PluginTrust, PluginsCheckSurvivesALibraryThatCrashes) {
  const std::string crash = add("fixture_crashes_on_load", "crash.so");
  std::string out;
  const int rc = test::run_tightfit("plugins check " + crash, &out);
  EXPECT_EQ(rc, 4) << out;
  EXPECT_NE(out.find(crash), std::string::npos) << out;
  EXPECT_NE(out.find("crashed while being loaded"), std::string::npos) << out;
  const std::string good = add("fixture_loads_quietly", "good.so");
  EXPECT_EQ(test::run_tightfit("plugins check " + good, &out), 0) << out;
  EXPECT_NE(out.find("hooks         run_step"), std::string::npos) << out;
}

// A scan is done once per file version: the same file is not loaded again
// (a crashing one included), a changed one is.
TEST_F(PluginTrust, ScansAreCachedByFileIdentity) {
  const std::string good = add("fixture_loads_quietly", "good.so");
  add("fixture_crashes_on_load", "crash.so");
  {
    PluginRegistry reg;
    reg.add_path(plugins_.str(), "recipe");
    ASSERT_NE(reg.find_any("fixture_loads_quietly"), nullptr);
  }
  EXPECT_EQ(loads(), 2);
  EXPECT_TRUE(fs::exists(cache_.path() / "plugin-scan.json"));
  {
    PluginRegistry reg;
    reg.add_path(plugins_.str(), "recipe");
    ASSERT_NE(reg.find_any("fixture_loads_quietly"), nullptr);
    EXPECT_TRUE(has_problem(reg, "crash.so", "crashed while being loaded")) << problems(reg);
  }
  EXPECT_EQ(loads(), 2) << "a file that did not change was scanned again";
  // A new modification time is a new version of the file.
  const timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, good.c_str(), times, 0), 0);
  {
    PluginRegistry reg;
    reg.add_path(plugins_.str(), "recipe");
    ASSERT_NE(reg.find_any("fixture_loads_quietly"), nullptr);
  }
  EXPECT_EQ(loads(), 3);
  // A damaged cache is a cold cache, not an error.
  std::ofstream(cache_.path() / "plugin-scan.json") << "{\"kernel\": [[[";
  PluginRegistry reg;
  reg.add_path(plugins_.str(), "recipe");
  EXPECT_NE(reg.find_any("fixture_loads_quietly"), nullptr) << problems(reg);
  EXPECT_EQ(loads(), 5);
}

// A pin is checked before any code of the library runs in this process,
// and a file replaced after its scan is refused instead of loaded.
TEST_F(PluginTrust, PinsAreCheckedBeforeTheLibraryRuns) {
  const std::string good = add("fixture_loads_quietly", "pinned.so");
  PluginRegistry reg;
  reg.add_path(plugins_.str(), "recipe");
  const std::string right = sha256_file_hex(good);
  std::string wrong = right;
  wrong[0] = wrong[0] == '0' ? '1' : '0';
  try {
    reg.find("fixture_loads_quietly", TF_PLUGIN_SCHEDULE, wrong);
    FAIL() << "a library whose hash differs from its pin was loaded";
  } catch (const PluginPinMismatch& e) {
    EXPECT_EQ(e.actual, right);
    EXPECT_NE(std::string(e.what()).find(good), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::getenv("TIGHTFIT_FIXTURE_LOADED"), nullptr);
  EXPECT_NO_THROW(reg.find("fixture_loads_quietly", TF_PLUGIN_SCHEDULE, right));
  EXPECT_NE(std::getenv("TIGHTFIT_FIXTURE_LOADED"), nullptr);

  // Swapped after the scan: another file under the scanned name.
  const std::string swapped = add("fixture_loads_quietly", "swapped.so");
  PluginRegistry reg2;
  reg2.add_path(swapped, "recipe");
  const std::string other = scratch_.str() + "/other.so";
  fs::copy_file(std::string(TIGHTFIT_FIXTURE_DIR) + "/fixture_good.so", other);
  fs::rename(other, swapped);
  try {
    reg2.find("fixture_loads_quietly", TF_PLUGIN_SCHEDULE);
    FAIL() << "a library replaced after its scan was loaded";
  } catch (const PluginLoadError& e) {
    EXPECT_NE(std::string(e.what()).find("changed after it was scanned"), std::string::npos)
        << e.what();
  }
}

// Plugins come from absolute folders only, and not from a folder or a file
// that someone besides the user can write.
TEST_F(PluginTrust, RelativeAndWritableByOthersPathsAreRefused) {
  {
    ScopedEnv path("TIGHTFIT_PLUGIN_PATH", "my-plugins:" + plugins_.str());
    const PluginRegistry reg = PluginRegistry::discover();
    EXPECT_TRUE(has_problem(reg, "\"my-plugins\" is relative", "$PWD/my-plugins")) << problems(reg);
    try {
      reg.find("nothing_by_this_name", TF_PLUGIN_STRATEGY);
      FAIL();
    } catch (const PluginLoadError& e) {
      EXPECT_NE(std::string(e.what()).find("is relative"), std::string::npos) << e.what();
    }
  }
  const std::string good = add("fixture_loads_quietly", "good.so");
  ASSERT_EQ(::chmod(good.c_str(), 0664), 0);
  {
    PluginRegistry reg;
    reg.add_path(plugins_.str(), "recipe");
    EXPECT_EQ(reg.find_any("fixture_loads_quietly"), nullptr);
    EXPECT_TRUE(has_problem(reg, "writable by its group (mode 0664)", "chmod go-w " + good))
        << problems(reg);
  }
  ASSERT_EQ(::chmod(good.c_str(), 0644), 0);
  ASSERT_EQ(::chmod(plugins_.str().c_str(), 0777), 0);
  {
    PluginRegistry reg;
    reg.add_path(plugins_.str(), "recipe");
    EXPECT_EQ(reg.find_any("fixture_loads_quietly"), nullptr);
    EXPECT_TRUE(
        has_problem(reg, "writable by everyone (mode 0777)", "chmod go-w " + plugins_.str()))
        << problems(reg);
  }
  ASSERT_EQ(::chmod(plugins_.str().c_str(), 0700), 0);
  PluginRegistry reg;
  reg.add_path(plugins_.str(), "recipe");
  EXPECT_NE(reg.find_any("fixture_loads_quietly"), nullptr) << problems(reg);
  EXPECT_EQ(std::getenv("TIGHTFIT_FIXTURE_LOADED"), nullptr);
}

}  // namespace
}  // namespace tightfit
