// Facts the docs state that the binary or the suite can produce are checked
// against them, so the docs stay true as the code moves (issue 64): the plugin
// ABI the host speaks, the number of tests the README times, and every
// example of `tightfit plan` (and `--version`, `plugins`) the README and
// docs/ show, line for line. `fit` examples measure the machine, so only their
// search's count is checked; their figures carry a date.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

std::string text_of(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// README.md and every page of docs/.
std::vector<fs::path> pages() {
  const fs::path root = TIGHTFIT_SOURCE_DIR;
  std::vector<fs::path> out{root / "README.md", root / "plugin-api" / "README.md"};
  for (const auto& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    out.push_back(line);
  }
  return out;
}

// `tightfit ARGS` run from the source folder (the docs' paths are from there).
std::string run_from_source(const std::string& args) {
  std::string out;
  test::run_command(
      std::string("cd ") + TIGHTFIT_SOURCE_DIR + " && " + TIGHTFIT_BINARY + " " + args, &out);
  return out;
}

std::string abi_of_binary() {
  std::smatch m;
  const std::string version = run_from_source("--version");
  static const std::regex abi("plugin ABI ([0-9]+\\.[0-9]+)");
  return std::regex_search(version, m, abi) ? m[1].str() : "";
}

TEST(DocsFacts, EveryStatementOfTheHostsAbiIsTheBinarys) {
  const std::string abi = abi_of_binary();
  ASSERT_FALSE(abi.empty());
  // The host's own version, as the binary and its messages word it (not
  // "added in ABI 1.12", which is history).
  static const std::regex said(
      "(\\(plugin ABI|this host speaks|this host has only) ([0-9]+\\.[0-9]+)(, LibTorch| "
      "\\(major|;)");
  int statements = 0;
  for (const fs::path& page : pages()) {
    const std::string text = text_of(page);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), said);
         it != std::sregex_iterator(); ++it) {
      ++statements;
      EXPECT_EQ((*it)[2].str(), abi)
          << page.filename() << ": \"" << (*it)[0].str() << "\" — the binary hosts ABI " << abi;
    }
  }
  EXPECT_GE(statements, 1);
}

// The number of tests the README times is the suite's.
TEST(DocsFacts, TheReadmesTestCountIsTheSuites) {
  char self[4096] = {0};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof self - 1), 0);
  const fs::path build = fs::path(self).parent_path().parent_path();
  std::string listed;
  test::run_command("ctest --test-dir " + build.string() + " -N", &listed);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(listed, m, std::regex("Total Tests: ([0-9]+)"))) << listed;
  const std::string suite = m[1].str();
  const std::string readme = text_of(fs::path(TIGHTFIT_SOURCE_DIR) / "README.md");
  static const std::regex claim("the ([0-9][0-9,]*) tests");
  int claims = 0;
  for (auto it = std::sregex_iterator(readme.begin(), readme.end(), claim);
       it != std::sregex_iterator(); ++it) {
    ++claims;
    std::string n = (*it)[1].str();
    n.erase(std::remove(n.begin(), n.end(), ','), n.end());
    EXPECT_EQ(n, suite) << "README.md says \"" << (*it)[0].str() << "\"; ctest -N lists " << suite
                        << ": time the suite again and say so";
  }
  EXPECT_GE(claims, 1) << "README.md no longer says how many tests it timed";
}

// An example in a page: a `$ tightfit ...` line of a fenced block and the
// lines shown under it (up to the next `$` line or the block's end).
struct Example {
  std::string page, command;
  std::vector<std::string> shown;
};

std::vector<Example> examples() {
  std::vector<Example> out;
  for (const fs::path& page : pages()) {
    bool in_block = false;
    Example* open = nullptr;
    for (const std::string& line : lines_of(text_of(page))) {
      if (line.rfind("```", 0) == 0) {
        in_block = !in_block;
        open = nullptr;
        continue;
      }
      if (!in_block) continue;
      if (line.rfind("$ ", 0) == 0) {
        open = nullptr;
        std::string command = line.substr(2);
        if (command.rfind("build/bin/", 0) == 0) command = command.substr(10);
        if (command.rfind("tightfit ", 0) != 0) continue;
        if (const auto hash = command.find("   #"); hash != std::string::npos)
          command = command.substr(0, hash);
        while (!command.empty() && command.back() == ' ') command.pop_back();
        out.push_back({page.filename().string(), command.substr(9), {}});
        open = &out.back();
      } else if (open && line != "..." && !line.empty()) {
        open->shown.push_back(line);
      }
    }
  }
  return out;
}

TEST(DocsFacts, EveryPlanExampleShowsWhatTheBinaryPrints) {
  test::TempDir dir;
  int checked = 0;
  for (const Example& e : examples()) {
    const std::string verb = e.command.substr(0, e.command.find(' '));
    if (verb != "plan" && verb != "fit" && verb != "--version" && verb != "plugins") continue;
    if (e.shown.empty()) continue;
    SCOPED_TRACE(e.page + ": $ tightfit " + e.command);
    if (verb == "fit") {
      // The machine's rates and so the ranking are this machine's; the
      // search (how many stacks, planned, fitting) and the longest row a
      // budget fits are the plan's.
      const std::string out = run_from_source(e.command + " --out " + dir.str() + "/fit" +
                                              std::to_string(checked) + ".toml");
      const std::vector<std::string> got = lines_of(out);
      for (const std::string& line : e.shown) {
        const bool search =
            line.rfind("fit: ", 0) == 0 && line.find(" stacks: ") != std::string::npos;
        if (!search && line.rfind("longest       ", 0) != 0) continue;
        EXPECT_NE(std::find(got.begin(), got.end(), line), got.end())
            << "shown: " << line << "\nprinted:\n"
            << out;
      }
      ++checked;
      continue;
    }
    const std::string out = run_from_source(e.command);
    const std::vector<std::string> got = lines_of(out);
    for (const std::string& line : e.shown)
      EXPECT_NE(std::find(got.begin(), got.end(), line), got.end())
          << "shown: " << line << "\nprinted:\n"
          << out;
    ++checked;
  }
  EXPECT_GE(checked, 4) << "the docs' plan examples were not found";
}

}  // namespace
}  // namespace tightfit
