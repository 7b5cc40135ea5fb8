// Recipes: every mistake is an error naming file:line:column; --set overrides.
#include <gtest/gtest.h>

#include <regex>

#include "test_support.hpp"

namespace tightfit {
namespace {

using test::TempDir;

// The RecipeError message that building a session from `text` throws.
using test::recipe_error;

class RecipeTest : public ::testing::Test {
 protected:
  TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string base(const std::string& model_extra = "", const std::string& extra = "") const {
    return test::tiny_recipe(corpus, dir.str(), model_extra, extra);
  }
};

TEST_F(RecipeTest, ValidRecipeBuilds) {
  EXPECT_NO_THROW(test::make_session(base()));
}

TEST_F(RecipeTest, UnknownKeyNamesPositionAndValidKeys) {
  const std::string msg = recipe_error(base("n_layers = 3\n"));
  // n_layers sits on line 17 of the tiny recipe, column 1.
  EXPECT_TRUE(std::regex_search(msg, std::regex("^my\\.toml:17:1: unknown key \"n_layers\"")))
      << msg;
  EXPECT_NE(msg.find("Valid keys: plugin, weights, sha256, preset, config, n_layer"),
            std::string::npos)
      << msg;
}

TEST_F(RecipeTest, UnknownKeyInKernelTable) {
  const std::string msg = recipe_error(base("", "[optimizer2]\nlr = 1\n"));
  EXPECT_TRUE(
      std::regex_search(msg, std::regex("^my\\.toml:\\d+:\\d+: unknown table \"optimizer2\"")))
      << msg;
}

TEST_F(RecipeTest, WrongTypeNamesPositionAndType) {
  const std::string msg = recipe_error(base("dropout = \"high\"\n"));
  EXPECT_TRUE(
      std::regex_search(msg, std::regex("^my\\.toml:17:11: .*dropout must be of type float")))
      << msg;
}

TEST_F(RecipeTest, OutOfRangeValue) {
  const std::string msg = recipe_error(base("dropout = 1.5\n"));
  EXPECT_TRUE(std::regex_search(msg, std::regex("^my\\.toml:17:11: .*out of range \\[0, 1\\]")))
      << msg;
}

TEST_F(RecipeTest, ChoiceNotAllowed) {
  std::string text = base();
  text.replace(text.find("preset = \"custom\""), 17, "preset = \"huge\"");
  const std::string msg = recipe_error(text);
  EXPECT_NE(msg.find("is not one of: tiny|124M|350M|774M|1.5B|custom"), std::string::npos) << msg;
}

TEST_F(RecipeTest, MissingRequiredKeyNamesTable) {
  std::string text = base();
  text.replace(text.find("plugin = \"gpt2\""), 15, "preset = \"tiny\"");
  text.replace(text.find("preset = \"custom\""), 17, "");
  const std::string msg = recipe_error(text);
  EXPECT_TRUE(std::regex_search(
      msg, std::regex("^my\\.toml:\\d+:\\d+: \\[model\\] needs the key \"plugin\"")))
      << msg;
}

TEST_F(RecipeTest, MissingRequiredKeyOfPluginDeclaration) {
  const Recipe r = Recipe::parse("[x]\nb = 1\n", "k.toml");
  std::vector<KeySpec> keys = {KeySpec{"a", TF_VALUE_INT, std::nullopt, "needed", 1, 0, ""},
                               KeySpec{"b", TF_VALUE_INT, "1", "optional", 1, 0, ""}};
  try {
    r.validate(r.table("x"), "[x]", keys);
    FAIL();
  } catch (const RecipeError& e) {
    EXPECT_TRUE(
        std::regex_search(e.what(), std::regex("^k\\.toml:1:1: \\[x\\] needs the key \"a\"")))
        << e.what();
  }
}

TEST_F(RecipeTest, UnknownPluginNamesPositionAndInstalledOnes) {
  std::string text = base();
  text.replace(text.find("plugin = \"gpt2\""), 15, "plugin = \"gpt9\"");
  const std::string msg = recipe_error(text);
  EXPECT_TRUE(
      std::regex_search(msg, std::regex("^my\\.toml:11:10: no model plugin named \"gpt9\"")))
      << msg;
  EXPECT_NE(msg.find("gpt2"), std::string::npos) << msg;
}

TEST_F(RecipeTest, UnknownStrategyPluginNamesPosition) {
  const std::string msg = recipe_error(base("", "[[strategy]]\nplugin = \"nope\"\n"));
  EXPECT_TRUE(
      std::regex_search(msg, std::regex("^my\\.toml:\\d+:10: no strategy plugin named \"nope\"")))
      << msg;
}

TEST_F(RecipeTest, SyntaxErrorNamesPosition) {
  try {
    Recipe::parse("[run]\nsteps = = 3\n", "bad.toml");
    FAIL();
  } catch (const RecipeError& e) {
    EXPECT_TRUE(std::regex_search(e.what(), std::regex("^bad\\.toml:2:\\d+: TOML syntax error")))
        << e.what();
  }
}

TEST_F(RecipeTest, MissingFileIsClear) {
  try {
    Recipe::load(dir.str() + "/nope.toml");
    FAIL();
  } catch (const RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open recipe"), std::string::npos);
  }
}

TEST_F(RecipeTest, SetOverridesValuesTablesAndStrategies) {
  Recipe r =
      Recipe::parse(base("", "[[strategy]]\nplugin = \"checkpoint\"\nevery = 1\n"), "my.toml");
  r.apply_override("model.n_layer=3");
  r.apply_override("run.name=renamed");  // a bare word is a string
  r.apply_override("strategy.checkpoint.every=2");
  r.apply_override("strategy.0.plugin=checkpoint");
  r.apply_override("optimizer.lr=0.5");
  EXPECT_EQ(r.root()["model"]["n_layer"].value<int64_t>(), 3);
  EXPECT_EQ(r.root()["run"]["name"].value<std::string>(), "renamed");
  EXPECT_EQ((*r.root()["strategy"].as_array())[0].as_table()->get("every")->value<int64_t>(), 2);
  EXPECT_EQ(r.root()["optimizer"]["lr"].value<double>(), 0.5);
}

TEST_F(RecipeTest, SetValueOfWrongTypeIsBlamedOnSet) {
  Recipe r = Recipe::parse(base(), "my.toml");
  r.apply_override("model.n_layer=three");
  try {
    Session s(r, test::registry());
    FAIL();
  } catch (const RecipeError& e) {
    EXPECT_TRUE(
        std::regex_search(e.what(), std::regex("^--set: .*n_layer must be of type integer")))
        << e.what();
  }
}

TEST_F(RecipeTest, SetRejectsMalformedAssignment) {
  Recipe r = Recipe::parse(base(), "my.toml");
  EXPECT_THROW(r.apply_override("novalue"), RecipeError);
  EXPECT_THROW(r.apply_override("strategy.7.every=1"), RecipeError);
}

// An entry selector of more digits than any index (std::stoul would throw
// out_of_range), or of UTF-8 bytes (negative chars), is a RecipeError naming it.
TEST_F(RecipeTest, SetRefusesHugeAndNonAsciiEntrySelectors) {
  Recipe r =
      Recipe::parse(base("", "[[strategy]]\nplugin = \"checkpoint\"\nevery = 1\n"), "my.toml");
  for (const std::string sel : {"99999999999999999999999", "\xc3\xa9", "1\xc2\xb2"}) {
    try {
      r.apply_override("strategy." + sel + ".every=2");
      ADD_FAILURE() << "selector " << sel << " was accepted";
    } catch (const RecipeError& e) {
      EXPECT_NE(std::string(e.what()).find("no [[strategy]] entry \"" + sel + "\""),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(ByteSize, ParsesUnits) {
  EXPECT_EQ(parse_byte_size("8GiB"), 8ll << 30);
  EXPECT_EQ(parse_byte_size("512MB"), 512000000ll);
  EXPECT_EQ(parse_byte_size("1.5KiB"), 1536);
  EXPECT_EQ(parse_byte_size("123"), 123);
  EXPECT_THROW(parse_byte_size("8 parsecs"), std::invalid_argument);
}

}  // namespace
}  // namespace tightfit
