// Plugins that break the ABI's rules: each gets a clear refusal or error
// naming the plugin (and the hook), never a crash of the host.
#include <gtest/gtest.h>

#include "plugin_loader.hpp"
#include "session.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

const std::string kHostile = std::string(TIGHTFIT_FIXTURE_DIR) + "/hostile";

std::string recipe(const test::TempDir& dir, const std::string& plugin, const std::string& mode) {
  std::string r =
      test::tiny_recipe(test::write_corpus(dir), dir.str(), "",
                        "[[strategy]]\nplugin = \"" + plugin + "\"\nmode = \"" + mode + "\"\n");
  r.replace(r.find("[run]\n"), 6, "[run]\nplugin_paths = [\"" + kHostile + "/" + plugin + "\"]\n");
  return r;
}

// The error building or training a session from `text`, "" when it ran.
std::string train_error(const std::string& text) {
  try {
    test::make_session(text)->train();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A vtable shorter than the host's (an older header): the host copies it into
// a zeroed struct of its own size, so the hooks past the plugin's size read as
// absent, whatever the bytes after the plugin's struct hold (here: hooks that
// abort the process if called).
TEST(HostilePlugins, HooksPastAShortVtableAreNeverCalled) {
  const LoadedPlugin p =
      load_plugin_file(kHostile + "/short_vtable_strategy/short_vtable_strategy.so", "file");
  EXPECT_EQ(p.plugin_vtable_size, offsetof(tf_strategy_vtable, fetch_weight));
  ASSERT_NE(p.strategy(), nullptr);
  EXPECT_EQ(p.strategy()->struct_size, sizeof(tf_strategy_vtable));
  EXPECT_NE(p.strategy()->step_begin, nullptr);
  EXPECT_EQ(p.strategy()->fetch_weight, nullptr);
  EXPECT_EQ(p.strategy()->grad_ready, nullptr);
  test::TempDir dir;
  EXPECT_EQ(train_error(recipe(dir, "short_vtable_strategy", "none")), "");
}

TEST(HostilePlugins, AnEntryThatThrowsIsRefusedNamingTheFile) {
  const std::string path = kHostile + "/throwing_entry_strategy/throwing_entry_strategy.so";
  try {
    load_plugin_file(path, "file");
    FAIL() << "loaded";
  } catch (const PluginLoadError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("threw an exception (hostile entry)"), std::string::npos)
        << e.what();
  }
}

// A hook that throws, one that returns a status no header defines, one that
// says TF_OK but hands back no tensor: each stops the run with an error
// naming the plugin and the hook.
TEST(HostilePlugins, ThrowsUnknownStatusesAndMissingTensorsAreErrorsNamingThePlugin) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"throw", "threw an exception in step_begin (hostile step_begin)"},
      {"unknown_status", "failed in step_begin: status 42"},
      {"no_tensor", "returned TF_OK from fetch_weight but no tensor"},
  };
  for (const auto& [mode, expected] : cases) {
    test::TempDir dir;
    const std::string err = train_error(recipe(dir, "hostile_strategy", mode));
    EXPECT_NE(err.find("\"hostile_strategy\""), std::string::npos) << mode << ": " << err;
    EXPECT_NE(err.find(expected), std::string::npos) << mode << ": " << err;
  }
  test::TempDir dir;
  EXPECT_EQ(train_error(recipe(dir, "hostile_strategy", "none")), "");
}

}  // namespace
}  // namespace tightfit
