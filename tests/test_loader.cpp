// The loader opens valid plugins and refuses broken ones with a message that
// names the file and the reason.
#include <gtest/gtest.h>

#include <filesystem>

#include "plugin_loader.hpp"
#include "recipe.hpp"
#include "sha256.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

std::string fixture(const std::string& name) {
  return std::string(TIGHTFIT_FIXTURE_DIR) + "/" + name + ".so";
}

// The message of the PluginLoadError that loading `path` throws.
std::string refusal(const std::string& path) {
  try {
    load_plugin_file(path, "file");
  } catch (const PluginLoadError& e) {
    return e.what();
  }
  ADD_FAILURE() << path << " loaded but should have been refused";
  return {};
}

TEST(Loader, BuiltInPluginsLoadWithTheirDeclarations) {
  const LoadedPlugin p =
      load_plugin_file(std::string(TIGHTFIT_PLUGIN_DIR) + "/libtightfit_gpt2.so", "file");
  EXPECT_EQ(p.name, "gpt2");
  EXPECT_EQ(p.descriptor.kind, TF_PLUGIN_MODEL);
  EXPECT_EQ(p.libtorch_version, host_libtorch_version());
  ASSERT_NE(p.model(), nullptr);
  EXPECT_NE(p.model()->stage_forward, nullptr);
  bool has_preset = false;
  for (const auto& k : p.keys) has_preset |= k.name == "preset";
  EXPECT_TRUE(has_preset);
}

TEST(Loader, ValidCFixtureLoads) {
  const LoadedPlugin p = load_plugin_file(fixture("fixture_good"), "file");
  EXPECT_EQ(p.name, "fixture_good");
  ASSERT_EQ(p.keys.size(), 1u);
  EXPECT_EQ(p.keys[0].name, "answer");
  EXPECT_EQ(*p.keys[0].default_value, "42");
}

TEST(Loader, RefusesWrongAbiMajor) {
  const std::string msg = refusal(fixture("fixture_abi_major"));
  EXPECT_NE(msg.find(fixture("fixture_abi_major")), std::string::npos) << msg;
  EXPECT_NE(msg.find("ABI 2.0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("major versions must match"), std::string::npos) << msg;
}

TEST(Loader, RefusesNewerAbiMinor) {
  const std::string msg = refusal(fixture("fixture_abi_minor"));
  EXPECT_NE(msg.find("needs plugin ABI 1.99"), std::string::npos) << msg;
}

TEST(Loader, RefusesLibraryWithoutEntrySymbol) {
  const std::string msg = refusal(fixture("fixture_no_entry"));
  EXPECT_NE(msg.find(fixture("fixture_no_entry")), std::string::npos) << msg;
  EXPECT_NE(msg.find("no entry symbol \"tightfit_plugin_entry\""), std::string::npos) << msg;
}

TEST(Loader, RefusesOtherLibTorchVersion) {
  const std::string msg = refusal(fixture("fixture_wrong_libtorch"));
  EXPECT_NE(msg.find("built against LibTorch 1.0.0"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::string("this host uses LibTorch ") + host_libtorch_version()),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rebuild"), std::string::npos) << msg;
}

TEST(Loader, StableOnlyPluginLoadsDespiteOtherLibTorch) {
  const LoadedPlugin p = load_plugin_file(fixture("fixture_stable_only"), "file");
  EXPECT_EQ(p.libtorch_version, "1.0.0");
  EXPECT_TRUE(p.descriptor.flags & TF_PLUGIN_FLAG_STABLE_ABI_ONLY);
}

TEST(Loader, RefusesTooSmallDescriptorBeforeReadingIt) {
  const std::string msg = refusal(fixture("fixture_small_struct"));
  EXPECT_NE(msg.find("struct_size 12"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fixture("fixture_small_struct")), std::string::npos) << msg;
}

// What `tightfit fit` may try (ABI 1.23) is checked as a recipe's value
// would be: a value the key refuses makes the plugin a problem, by name.
TEST(Loader, RefusesASearchValueItsOwnKeyRefuses) {
  const std::string msg = refusal(fixture("fixture_bad_search"));
  EXPECT_NE(msg.find(fixture("fixture_bad_search")), std::string::npos) << msg;
  EXPECT_NE(msg.find("fixture_bad_search.answer's search: value 200 is not one the key takes"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("out of range [0, 100]"), std::string::npos) << msg;
  // Declarations the keys take come through the scanner's answer whole, in
  // their order (quantize's formats, least saving first).
  const PluginInfo* quantize = test::registry().find_any("quantize");
  ASSERT_NE(quantize, nullptr);
  ASSERT_TRUE(quantize->search.has_value());
  EXPECT_EQ(quantize->search->flags, TF_SEARCH_PLUGIN_FROZEN_WEIGHTS);
  const auto format = std::find_if(quantize->keys.begin(), quantize->keys.end(),
                                   [](const KeySpec& k) { return k.name == "format"; });
  ASSERT_NE(format, quantize->keys.end());
  ASSERT_TRUE(format->search.has_value());
  ASSERT_EQ(format->search->values.size(), 2u);
  EXPECT_EQ(format->search->values[0].value, "\"int8\"");
  EXPECT_EQ(format->search->values[1].label, "nf4 base");
  EXPECT_EQ(format->search->flags, TF_SEARCH_KEY_RECIPES_CHOICE);
}

TEST(Loader, RefusesMissingFile) {
  const std::string msg = refusal("/nonexistent/libnothing.so");
  EXPECT_NE(msg.find("/nonexistent/libnothing.so"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST(Registry, ScanningRecordsBrokenPluginsAndKeepsGoodOnes) {
  PluginRegistry reg;
  reg.add_path(TIGHTFIT_FIXTURE_DIR, "TIGHTFIT_PLUGIN_PATH");
  EXPECT_NE(reg.find_any("fixture_good"), nullptr);
  EXPECT_NE(reg.find_any("fixture_stable_only"), nullptr);
  EXPECT_EQ(reg.find_any("fixture_abi_major"), nullptr);
  EXPECT_GE(reg.problems().size(), 5u);
}

// Two files declaring one name: using the name is an error naming both
// files; the same file reached twice is not a conflict.
TEST(Registry, TwoPluginsWithOneNameConflict) {
  test::TempDir dir;
  const std::string copy = dir.str() + "/fixture_good_copy.so";
  std::filesystem::copy_file(fixture("fixture_good"), copy);
  PluginRegistry reg;
  reg.add_path(fixture("fixture_good"), "TIGHTFIT_PLUGIN_PATH");
  reg.add_path(fixture("fixture_good"), "recipe");
  EXPECT_NE(reg.find_any("fixture_good"), nullptr);
  reg.add_path(dir.str(), "recipe");
  try {
    reg.find("fixture_good", TF_PLUGIN_SCHEDULE);
    FAIL() << "a conflicting name was served";
  } catch (const PluginLoadError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("two plugins are named \"fixture_good\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(fixture("fixture_good")), std::string::npos) << msg;
    EXPECT_NE(msg.find(copy), std::string::npos) << msg;
  }
  EXPECT_THROW(reg.find_any("fixture_good"), PluginLoadError);
  bool reported = false;
  for (const auto& p : reg.problems()) reported |= p.find(copy) != std::string::npos;
  EXPECT_TRUE(reported);
}

// A recipe pins a plugin by its file's SHA-256: the right hash composes, a
// different one is refused at the pin's line with both hashes, a malformed
// one says what a pin is.
TEST(Pinning, Sha256InARecipeIsChecked) {
  test::TempDir dir;
  const std::string file = std::string(TIGHTFIT_PLUGIN_DIR) + "/libtightfit_checkpoint.so";
  const std::string good = sha256_file_hex(file);
  ASSERT_EQ(good.size(), 64u);
  auto recipe = [&](const std::string& pin) {
    return test::tiny_recipe(test::write_corpus(dir), dir.str(), "",
                             "[[strategy]]\nplugin = \"checkpoint\"\nsha256 = \"" + pin + "\"\n");
  };
  SessionOptions dry;
  dry.dry_run = true;
  std::string upper = good;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_NO_THROW(test::make_session(recipe(upper), dry));
  std::string other = good;
  other[0] = other[0] == '0' ? '1' : '0';
  try {
    test::make_session(recipe(other), dry);
    FAIL() << "a plugin whose hash differs from the pin was loaded";
  } catch (const RecipeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("recipe.toml:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("has SHA-256 " + good), std::string::npos) << msg;
    EXPECT_NE(msg.find("not the pinned " + other), std::string::npos) << msg;
  }
  try {
    test::make_session(recipe("abc"), dry);
    FAIL() << "a malformed pin was accepted";
  } catch (const RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("64 hex digits"), std::string::npos) << e.what();
  }
}

TEST(Registry, BuiltInFolderIsFoundWithoutEnvironment) {
  const PluginRegistry& reg = test::registry();
  EXPECT_NE(reg.find_any("gpt2"), nullptr);
  EXPECT_NE(reg.find_any("checkpoint"), nullptr);
  EXPECT_NE(reg.find_any("standard"), nullptr);
  EXPECT_EQ(reg.find_any("gpt2")->origin, "built-in");
}

TEST(Registry, UnknownNameListsInstalledPlugins) {
  try {
    test::registry().find("gpt3", TF_PLUGIN_MODEL);
    FAIL() << "found a plugin that does not exist";
  } catch (const PluginLoadError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no model plugin named \"gpt3\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("gpt2"), std::string::npos) << msg;
  }
}

TEST(Registry, KindMismatchIsNamed) {
  try {
    test::registry().find("checkpoint", TF_PLUGIN_MODEL);
    FAIL();
  } catch (const PluginLoadError& e) {
    EXPECT_NE(std::string(e.what()).find("is a strategy plugin"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tightfit
