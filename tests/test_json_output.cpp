// JSON tightfit writes keeps text that is not UTF-8 (a folder named in
// Latin-1): written as Python's surrogateescape writes it, read back byte
// for byte here and by Python; valid text is written exactly as before.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "json_output.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(JsonOutput, BytesOutsideUtf8RoundTrip) {
  const std::string latin1 = "/runs/caf\xe9/t\xff\x80";
  const std::string mixed = "\xf0\x9f\x99\x82 ok \xc3 \xe9t\xc3\xa9";  // an emoji, a cut é, Latin-1
  const json j = {{"run", latin1}, {"list", {mixed, "plain", 3}}, {"k\xe9y", "v"}};
  const std::string text = dump_json(j, 2);
  EXPECT_NE(text.find("caf\\udce9"), std::string::npos) << text;
  EXPECT_NE(text.find("k\\udce9y"), std::string::npos) << text;
  EXPECT_EQ(parse_own_json(text, "t.json"), j);
  // Valid text: exactly dump()'s, pairs and private-use characters included.
  const json valid = {{"a", "\xf0\x9f\x99\x82 \xf4\x8f\xbf\xbf caf\xc3\xa9"}, {"n", 1.5}};
  EXPECT_EQ(dump_json(valid, 2), valid.dump(2));
  EXPECT_EQ(parse_own_json(valid.dump(), "t.json"), valid);
  // A pair written as escapes is a character, not two bytes.
  EXPECT_EQ(parse_own_json(R"({"a": "\ud83c\udc80"})", "t.json")["a"], "\xf0\x9f\x82\x80");
}

TEST(JsonOutput, PythonReadsThePathBack) {
  const std::string python = std::string(TIGHTFIT_SOURCE_DIR) + "/.venv/bin/python";
  if (!fs::exists(python)) GTEST_SKIP() << "no .venv (scripts/setup makes it)";
  test::TempDir dir;
  const std::string path = dir.str() + "/caf\xe9";
  test::write_file(dir, "m.json", dump_json(json{{"run", path}}, 2));
  std::string out;
  ASSERT_EQ(test::run_command(python +
                                  " -c \"import json, os, sys; sys.stdout.buffer.write("
                                  "os.fsencode(json.load(open('" +
                                  dir.str() + "/m.json'))['run']))\"",
                              &out),
            0)
      << out;
  EXPECT_EQ(out, path);
}

// A run in a folder named in Latin-1 saves its checkpoints (nlohmann's dump
// refused the manifest's path before: no save ever succeeded) and resumes
// from them as its own run's.
TEST(JsonOutput, ARunInALatin1FolderSavesAndResumes) {
  test::TempDir dir;
  const fs::path folder = dir.path() / "caf\xe9";
  fs::create_directories(folder);
  std::string text = test::tiny_recipe(test::write_corpus(dir), "runs", "", "[save]\nevery = 2\n");
  const std::string recipe = (folder / "r.toml").string();
  std::ofstream(recipe) << text;
  std::string out;
  // A recipe is UTF-8 (TOML): its out_dir is relative, the folder it runs in is not.
  const std::string run = "cd \"" + folder.string() + "\" && " + TIGHTFIT_BINARY + " run r.toml -q";
  ASSERT_EQ(test::run_command(run, &out), 0) << out;
  const fs::path manifest = folder / "runs" / "t" / "checkpoints" / "manifest.json";
  std::ifstream in(manifest);
  const std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(parse_own_json(body, manifest.string())["latest"], "step-00000004") << body;
  text.replace(text.find("steps = 4"), 9, "steps = 6");
  std::ofstream(recipe) << text;
  ASSERT_EQ(test::run_command(run + " --resume", &out), 0) << out;
  std::ifstream in2(manifest);
  const std::string body2((std::istreambuf_iterator<char>(in2)), std::istreambuf_iterator<char>());
  EXPECT_EQ(parse_own_json(body2, manifest.string())["latest"], "step-00000006") << body2;
}

}  // namespace
}  // namespace tightfit
