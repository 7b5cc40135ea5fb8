// Careless and hostile input (issue 21): numbers that are not numbers, sizes
// past int64, devices tightfit does not train on and sampling edge values
// are refused by name with exit 2 — never a LibTorch exception, never a
// silently switched-off budget.
#include <gtest/gtest.h>

#include <regex>

#include "memory_accounting.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

std::string recipe_error(const std::string& text) {
  try {
    test::make_session(text, {}, "my.toml");
  } catch (const RecipeError& e) {
    return e.what();
  }
  ADD_FAILURE() << "recipe was accepted:\n" << text;
  return {};
}

class HostileNumbers : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  // The tiny recipe with `key = value` added to [table] (first line of it).
  std::string with(const std::string& table, const std::string& line) const {
    std::string text = test::tiny_recipe(corpus, dir.str());
    const auto at = text.find("[" + table + "]\n");
    EXPECT_NE(at, std::string::npos) << table;
    // A key the recipe sets already is replaced (TOML allows no second).
    const std::string key = line.substr(0, line.find(' '));
    if (const auto old = text.find("\n" + key + " = ", at); old != std::string::npos)
      text.erase(old + 1, text.find('\n', old + 1) - old);
    text.insert(at + table.size() + 3, line + "\n");
    return text;
  }
};

// TOML spells NaN and infinity; every float key refuses them with the place,
// those with a range and those without.
TEST_F(HostileNumbers, NanAndInfinityAreRefusedWithFileLineColumn) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"optimizer", "lr = nan"},         {"optimizer", "lr = +inf"},
      {"optimizer", "grad_clip = -inf"}, {"optimizer", "weight_decay = nan"},
      {"data", "val_fraction = nan"},    {"model", "dropout = nan"},
      {"run", "dist_timeout = inf"}};
  for (const auto& [table, line] : cases) {
    const std::string msg = recipe_error(with(table, line));
    const std::string key = line.substr(0, line.find(' '));
    EXPECT_TRUE(
        std::regex_search(msg, std::regex("^my\\.toml:\\d+:\\d+: \\[" + table + "\\].*\\." + key +
                                          " = [-+]?(nan|inf) is not a finite number")))
        << line << ": " << msg;
  }
}

// A budget that cannot be a number of bytes is an error, never "no budget".
TEST_F(HostileNumbers, ByteSizesPastInt64OrNotNumbersAreRefused) {
  for (const std::string& v :
       {std::string("-1"), std::string("\"-5GiB\""), std::string("\"nanGiB\""),
        std::string("\"infGiB\""), std::string("\"1e30GiB\""),
        std::string("\"9223372036854775808\""), std::string("\"10000000TB\"")}) {
    const std::string msg = recipe_error(with("run", "memory_budget = " + v));
    EXPECT_TRUE(std::regex_search(msg, std::regex("^my\\.toml:\\d+:\\d+: .*memory_budget")))
        << v << ": " << msg;
  }
  EXPECT_THROW(parse_byte_size("nan"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("-inf"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("8192PB"), std::invalid_argument);
  EXPECT_EQ(parse_byte_size("8000000TB"), 8'000'000'000'000'000'000);  // still fits int64
  // The command line's budgets go through the same parser.
  std::string out;
  const std::string recipe = test::write_file(dir, "r.toml", test::tiny_recipe(corpus, dir.str()));
  for (const char* b : {"nan", "-1GiB", "1e300", "inf"}) {
    EXPECT_EQ(test::run_tightfit(std::string("plan ") + recipe + " --budget " + b, &out), 2)
        << b << ": " << out;
    EXPECT_NE(out.find("byte size"), std::string::npos) << out;
  }
}

TEST_F(HostileNumbers, DevicesTightfitDoesNotTrainOnAreRefused) {
  for (const char* d : {"meta", "mps", "cpu:3", "cuda:-1", "xla", "cpu:0:1", "cuda:99999999999"}) {
    const std::string msg = recipe_error(with("run", std::string("device = \"") + d + "\""));
    EXPECT_NE(msg.find("[run].device"), std::string::npos) << d << ": " << msg;
    EXPECT_NE(msg.find("use cpu, cuda or cuda:N"), std::string::npos) << d << ": " << msg;
  }
  EXPECT_NO_THROW(test::make_session(with("run", "device = \"cpu:0\"")));
}

// Sampling values at and past their edges: greedy where that is what they
// mean, else exit 2 naming the option — never a LibTorch error.
TEST_F(HostileNumbers, SamplingEdgeValues) {
  const std::string recipe = test::write_file(dir, "r.toml", test::tiny_recipe(corpus, dir.str()));
  std::string out;
  for (const char* bad : {"--top-p nan", "--top-p -0.1", "--top-p 1.5", "--temperature -1",
                          "--temperature nan", "--temperature inf", "--top-k -5", "-n -1"}) {
    EXPECT_EQ(test::run_tightfit("generate " + recipe + " -p Hi " + bad, &out), 2)
        << bad << ": " << out;
    EXPECT_NE(out.find("tightfit generate: --"), std::string::npos) << bad << ": " << out;
  }
  // top-p 0 keeps the likeliest token: greedy, as transformers keeps one.
  auto s = test::make_session(test::tiny_recipe(corpus, dir.str()));
  const std::string greedy = s->generate("The ", 24, 1, 0.0, 7);
  EXPECT_EQ(s->generate("The ", 24, 40, 0.8, 7, /*top_p=*/0.0), greedy);
  EXPECT_EQ(s->generate("The ", 24, 0, 1.0, 9, /*top_p=*/0.0), greedy);
  EXPECT_THROW(s->generate("The ", 4, 40, std::nan(""), 7), std::invalid_argument);
}

}  // namespace
}  // namespace tightfit
