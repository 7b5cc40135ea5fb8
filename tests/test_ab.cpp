// `tightfit ab`: variants run on the same seeds (same initial weights and data
// order), the files it writes, and a table whose numbers are the runs' own.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "json_output.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<json> read_metrics(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(Ab, ComparesVariantsOnTheSameSeedsWithTheRunsOwnNumbers) {
  test::TempDir dir;
  const std::string corpus = test::write_corpus(dir);
  const std::string base =
      test::write_file(dir, "plain.toml", test::tiny_recipe(corpus, dir.str()));
  const fs::path out = dir.path() / "ab";
  std::string log;
  ASSERT_EQ(test::run_tightfit("ab " + base +
                                   " --vary strategy=none,checkpoint,fused_update --seeds 2 "
                                   "--steps 6 --eval-interval 2 --out " +
                                   out.string(),
                               &log),
            0)
      << log;
  ASSERT_TRUE(fs::exists(out / "ab.json")) << log;
  ASSERT_TRUE(fs::exists(out / "ab.txt"));
  const json report = json::parse(std::ifstream(out / "ab.json"));
  ASSERT_EQ(report["variants"].size(), 3u);
  EXPECT_EQ(report["seeds"], json::array({7, 8}));
  for (const auto& v : report["variants"]) {
    ASSERT_EQ(v["runs"].size(), 2u);
    for (const auto& r : v["runs"]) {
      const auto m = read_metrics(r["run_dir"].get<std::string>());
      ASSERT_EQ(m.size(), 6u);
      EXPECT_EQ(r["final_train_loss"].get<double>(), m.back()["loss"].get<double>());
      EXPECT_EQ(r["wall_s"].get<double>(), m.back()["elapsed_s"].get<double>());
      EXPECT_EQ(r["peak_bytes"]["weights"].get<double>(), m.back()["peak_weights"].get<double>());
      // Held-out loss at steps 2, 4, 6.
      std::vector<double> evals;
      for (const auto& rec : m)
        if (rec.contains("eval_loss")) evals.push_back(rec["eval_loss"].get<double>());
      ASSERT_EQ(evals.size(), 3u);
      EXPECT_EQ(r["final_eval_loss"].get<double>(), evals.back());
      EXPECT_EQ(r["best_eval_loss"].get<double>(), *std::min_element(evals.begin(), evals.end()));
      EXPECT_EQ(r["backward_skipped"].get<double>(), 0.0);
    }
  }
  // Same seed, same start and data: checkpointing (exact) gives the plain
  // losses, so its gap is 0; another seed gives other losses.
  const auto& plain = report["variants"][0]["runs"];
  const auto& ckpt = report["variants"][1]["runs"];
  for (size_t k = 0; k < 2; ++k)
    EXPECT_EQ(read_metrics(plain[k]["run_dir"].get<std::string>()).front()["loss"],
              read_metrics(ckpt[k]["run_dir"].get<std::string>()).front()["loss"]);
  EXPECT_NE(read_metrics(plain[0]["run_dir"].get<std::string>()).front()["loss"],
            read_metrics(plain[1]["run_dir"].get<std::string>()).front()["loss"]);
  EXPECT_EQ(report["variants"][1]["mean"]["eval_gap"].get<double>(), 0.0);
  // The table shows the means.
  const double fused_eval = report["variants"][2]["mean"]["final_eval_loss"].get<double>();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", fused_eval);
  EXPECT_NE(log.find("strategy=fused_update"), std::string::npos) << log;
  EXPECT_NE(log.find(buf), std::string::npos) << log;
  // The HTML report, written by tightfit itself: five inline SVG plots, no
  // image files or scripts, and the note that checkpointing's curves are the
  // plain run's (exact), drawn dashed over them.
  std::ifstream in(out / "report.html");
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t plots = 0;
  for (size_t p = html.find("<svg "); p != std::string::npos; p = html.find("<svg ", p + 1))
    ++plots;
  EXPECT_EQ(plots, 5u) << log;
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_NE(html.find("<b>strategy=checkpoint</b> trains exactly as <b>strategy=none</b>"),
            std::string::npos)
      << html.substr(0, 4000);
  EXPECT_NE(html.find("stroke-dasharray='7,5'"), std::string::npos);
  EXPECT_EQ(html.find("<b>strategy=fused_update</b> trains exactly"), std::string::npos);
  // Two seeds: each variant's time is set against the first's, within noise or not.
  EXPECT_NE(html.find("paired by seed, 95% interval"), std::string::npos);
}

// The report's child process gets an argument vector, never a shell: a
// folder whose name holds a quote and a command is only a name.
TEST(Ab, AnOutputFolderNameIsNeverRunAsACommand) {
  test::TempDir dir;
  const std::string base =
      test::write_file(dir, "plain.toml", test::tiny_recipe(test::write_corpus(dir), dir.str()));
  const fs::path marker = dir.path() / "ran";
  const fs::path out = dir.path() / ("ab it's; touch " + marker.string() + " #");
  std::string log;
  ASSERT_EQ(
      test::run_tightfit("ab " + base + " --vary strategy=none,checkpoint --steps 2 --out \"" +
                             out.string() + "\"",
                         &log),
      0)
      << log;
  EXPECT_FALSE(fs::exists(marker)) << "the folder name ran as a shell command";
  EXPECT_TRUE(fs::exists(out / "ab.txt"));
  EXPECT_TRUE(fs::exists(out / "report.html")) << log;
}

// A folder named in Latin-1, for the runs and the report: ab writes its
// table, and ab.json keeps the folder's bytes (as \udcXX, read back here).
TEST(Ab, ALatin1FolderNameKeepsItsBytes) {
  test::TempDir dir;
  const fs::path folder = dir.path() / "caf\xe9";
  fs::create_directories(folder);
  const std::string base = (folder / "plain.toml").string();
  // A recipe is UTF-8 (TOML): its out_dir is relative, the folder it runs in is not.
  std::ofstream(base) << test::tiny_recipe(test::write_corpus(dir), "runs");
  const fs::path out = folder / "ab";
  std::string log;
  ASSERT_EQ(test::run_command("cd \"" + folder.string() + "\" && " + TIGHTFIT_BINARY +
                                  " ab plain.toml --vary strategy=none,checkpoint --steps 2 " +
                                  "--out \"" + out.string() + "\"",
                              &log),
            0)
      << log;
  EXPECT_TRUE(fs::exists(out / "ab.txt")) << log;
  std::ifstream in(out / "ab.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("caf\\udce9"), std::string::npos) << text.substr(0, 400);
  EXPECT_EQ(text.find("caf\xe9"), std::string::npos) << "the byte written raw: not JSON";
  // Read back, the report is what was written, the folder's byte included.
  EXPECT_EQ(dump_json(parse_own_json(text, "ab.json"), 2), text);
}

TEST(Ab, BadArgumentsAreUsageErrors) {
  test::TempDir dir;
  const std::string corpus = test::write_corpus(dir);
  const std::string base =
      test::write_file(dir, "plain.toml", test::tiny_recipe(corpus, dir.str()));
  std::string log;
  EXPECT_EQ(test::run_tightfit("ab " + base, &log), 2) << log;  // one variant
  EXPECT_EQ(test::run_tightfit("ab " + base + " --vary strategy", &log), 2) << log;
  EXPECT_EQ(test::run_tightfit("ab " + base + " " + base + " --vary steps=1,2", &log), 2) << log;
  EXPECT_EQ(test::run_tightfit("ab " + base + " " + base + " --seeds 0", &log), 2) << log;
  EXPECT_EQ(test::run_tightfit("ab " + base + " missing.toml --steps 2", &log), 2) << log;
  EXPECT_NE(log.find("missing.toml"), std::string::npos) << log;
}

// The seeds are ab's: a --set run.seed moves the first seed and every run still
// gets its own (the --set is not applied after ab's, which made N identical
// runs with an interval over them); a --vary of the seed is refused.
TEST(Ab, ASetSeedMovesTheFirstSeedAndEachRunKeepsItsOwn) {
  test::TempDir dir;
  const std::string corpus = test::write_corpus(dir);
  const std::string base =
      test::write_file(dir, "plain.toml", test::tiny_recipe(corpus, dir.str()));
  const fs::path out = dir.path() / "ab";
  std::string log;
  ASSERT_EQ(test::run_tightfit("ab " + base + " " + base +
                                   " --seeds 2 --steps 2 --no-html --set run.seed=40 --out " +
                                   out.string(),
                               &log),
            0)
      << log;
  const json report = json::parse(std::ifstream(out / "ab.json"));
  EXPECT_EQ(report["seeds"], json::array({40, 41}));
  for (const auto& v : report["variants"]) {
    ASSERT_EQ(v["runs"].size(), 2u);
    EXPECT_EQ(v["runs"][0]["seed"], 40);
    EXPECT_EQ(v["runs"][1]["seed"], 41);
    EXPECT_NE(read_metrics(v["runs"][0]["run_dir"].get<std::string>()).front()["loss"],
              read_metrics(v["runs"][1]["run_dir"].get<std::string>()).front()["loss"]);
  }
  // Seed 40 is the seed a plain run with run.seed=40 uses: the same first loss.
  ASSERT_EQ(test::run_tightfit("run " + base + " -q --set run.steps=1 --set run.seed=40 --set " +
                                   "run.name=single --set run.out_dir=" + dir.str(),
                               &log),
            0)
      << log;
  EXPECT_EQ(
      read_metrics(dir.path() / "single").front()["loss"],
      read_metrics(report["variants"][0]["runs"][0]["run_dir"].get<std::string>()).front()["loss"]);
  EXPECT_EQ(test::run_tightfit("ab " + base + " --vary run.seed=1,2 --steps 2", &log), 2) << log;
  EXPECT_NE(log.find("--seeds N"), std::string::npos) << log;
}

// A variant whose every run fails (here: out of its budget) keeps its row,
// with no figures, in the table and the HTML report, and ab says it failed.
TEST(Ab, AVariantThatFailsKeepsARowWithoutFigures) {
  test::TempDir dir;
  const std::string corpus = test::write_corpus(dir);
  const std::string base =
      test::write_file(dir, "plain.toml", test::tiny_recipe(corpus, dir.str()));
  const fs::path out = dir.path() / "ab";
  std::string log;
  EXPECT_NE(
      test::run_tightfit(
          "ab " + base + " --vary run.memory_budget=0,64KiB --steps 2 --out " + out.string(), &log),
      0)
      << log;
  EXPECT_NE(log.find("run.memory_budget=64KiB, seed 7 ... failed (exit 3"), std::string::npos)
      << log;
  const json report = json::parse(std::ifstream(out / "ab.json"));
  ASSERT_EQ(report["variants"].size(), 2u);
  EXPECT_TRUE(report["variants"][1]["mean"]["peak_bytes"]["total"].is_null()) << report.dump();
  std::ifstream in(out / "report.html");
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("<td>run.memory_budget=64KiB</td><td>-</td>"), std::string::npos) << log;
  EXPECT_NE(html.find("no figures (every run failed)"), std::string::npos) << log;
  // One seed: the report says its times carry no noise estimate.
  EXPECT_NE(html.find("Each time is one run"), std::string::npos) << log;
}
}  // namespace
}  // namespace tightfit
