// The tightfit command: run, export, generate, plugins — exit codes and output.
#include <gtest/gtest.h>
#include <pty.h>
#include <sys/wait.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "file_util.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

class CliTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string recipe =
      test::write_file(dir, "r.toml", test::tiny_recipe(test::write_corpus(dir), dir.str()));
};

TEST_F(CliTest, ExportThenGenerateFromTheHuggingFaceFolder) {
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " -q", &out), 0) << out;
  ASSERT_EQ(test::run_tightfit("export " + recipe + " --out " + dir.str() + "/hf", &out), 0) << out;
  EXPECT_TRUE(fs::exists(dir.path() / "hf" / "config.json"));
  EXPECT_TRUE(fs::exists(dir.path() / "hf" / "model.safetensors"));
  ASSERT_EQ(test::run_tightfit("generate " + dir.str() + "/hf -p Hello -n 12 --greedy", &out), 0)
      << out;
  EXPECT_EQ(out.rfind("Hello", 0), 0u) << out;
  EXPECT_GE(out.size(), 5u + 12u) << out;
  // The recipe's own checkpoint gives the same greedy text.
  std::string from_recipe;
  ASSERT_EQ(test::run_tightfit("generate " + recipe + " -p Hello -n 12 --greedy", &from_recipe), 0)
      << from_recipe;
  EXPECT_EQ(out, from_recipe);
}

TEST_F(CliTest, GenerateFromAFolderWithoutConfigIsAClearError) {
  std::string out;
  EXPECT_EQ(test::run_tightfit("generate " + dir.str() + " -p x", &out), 2) << out;
  EXPECT_NE(out.find("config.json"), std::string::npos) << out;
}

TEST_F(CliTest, PluginsListAndInfo) {
  std::string out;
  ASSERT_EQ(test::run_tightfit("plugins list", &out), 0) << out;
  for (const char* name : {"gpt2", "llama", "checkpoint", "standard"})
    EXPECT_NE(out.find(name), std::string::npos) << name;
  ASSERT_EQ(test::run_tightfit("plugins info llama", &out), 0) << out;
  EXPECT_NE(out.find("tiny|1B|7B|13B|30B|70B|qwen2-1.5B|custom"), std::string::npos) << out;
  EXPECT_NE(out.find("n_kv_head"), std::string::npos) << out;
  // The plugin names the Hugging Face model types it computes (ABI 1.2).
  EXPECT_NE(out.find("Hugging Face model types: llama, mistral, qwen2, qwen3, gemma, gemma2, "
                     "gemma3_text, phi3"),
            std::string::npos)
      << out;
  // A name the user typed that is not installed: a usage error naming what is.
  EXPECT_EQ(test::run_tightfit("plugins info nothing", &out), 2) << out;
  EXPECT_NE(out.find("installed: "), std::string::npos) << out;
  EXPECT_NE(out.find("llama"), std::string::npos) << out;
}

// generate and export of a recipe with no checkpoint refuse (exit 2), naming
// the folder and what to run; never a freshly initialized model.
TEST_F(CliTest, GenerateAndExportWithoutACheckpointRefuse) {
  std::string out;
  EXPECT_EQ(test::run_tightfit("generate " + recipe + " -p Hello -n 4", &out), 2) << out;
  EXPECT_NE(out.find("no checkpoint of " + recipe), std::string::npos) << out;
  EXPECT_NE(out.find("tightfit run " + recipe), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("export " + recipe + " --out " + dir.str() + "/hf", &out), 2) << out;
  EXPECT_NE(out.find("no checkpoint of"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir.path() / "hf"));
}

// seq_len past the model's positions is the user's value: exit 2 naming it.
TEST_F(CliTest, SeqLenPastTheModelsPositionsIsARecipeError) {
  std::string out;
  EXPECT_EQ(test::run_tightfit("run " + recipe + " -q --set data.seq_len=128", &out), 2) << out;
  EXPECT_NE(out.find("seq_len = 128 exceeds n_positions = 64"), std::string::npos) << out;
}

// The summary names exactly the folders the run wrote; a run that will keep
// nothing says so when it starts.
TEST_F(CliTest, SummaryNamesWhatTheRunSavedAndWarnsWhenNothingIsKept) {
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --set save.hf=true", &out), 0) << out;
  const auto line = out.find("saved         ");
  ASSERT_NE(line, std::string::npos) << out;
  EXPECT_NE(out.find("step-00000004", line), std::string::npos) << out;
  EXPECT_NE(out.find("/hf\n", line), std::string::npos) << out;
  EXPECT_EQ(out.find("adapter", line), std::string::npos) << out;
  EXPECT_EQ(out.find("keeps nothing"), std::string::npos) << out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --set save.final=false --set run.name=n", &out),
            0)
      << out;
  EXPECT_NE(out.find("this run keeps nothing"), std::string::npos) << out;
  EXPECT_NE(out.find("saved         nothing"), std::string::npos) << out;
}

// A sample past the model's positions is never cropped: the run refuses it
// by name (exit 2) after saving what it trained.
TEST_F(CliTest, ASamplePastTheModelsPositionsIsRefusedAfterSaving) {
  std::string out;
  EXPECT_EQ(test::run_tightfit("run " + recipe + " -q --set run.sample_tokens=100", &out), 2)
      << out;
  EXPECT_NE(out.find("[run] sample_tokens = 100"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir.path() / "t" / "checkpoints" / "step-00000004")) << out;
  EXPECT_EQ(
      test::run_tightfit("run " + recipe + " -q --set run.sample_tokens=40 --set run.name=s", &out),
      0)
      << out;
  // `generate` refuses such a count before its first token, naming -n and the
  // most it can give (an input error, not a plugin's failure in decode).
  EXPECT_EQ(test::run_tightfit("generate " + recipe + " -p Hello -n 100 --greedy", &out), 2) << out;
  EXPECT_NE(out.find("the model has 64 (n_positions). Ask for at most "), std::string::npos) << out;
  EXPECT_NE(out.find("generate -n"), std::string::npos) << out;
  EXPECT_EQ(out.find("decode"), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("generate " + recipe + " -p Hello -n 40 --greedy --no-cache", &out),
            0)
      << out;
}

// [run] answer_prompts: the prompts answered before the first step and after
// the last, printed side by side and kept in answers.jsonl; the answers after
// are what `generate` gives from the saved checkpoint. A bad prompts file is
// refused before training.
TEST_F(CliTest, AnswersBeforeAndAfterTrainingAreShownAndKept) {
  const std::string prompts = test::write_file(dir, "prompts.txt", "The \nA fool\n");
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --set run.answer_prompts=" + prompts +
                                   " --set run.answer_tokens=6 --set run.steps=20",
                               &out),
            0)
      << out;
  const auto at = out.find("answers       " + prompts);
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_NE(out.find("### A fool\n  before: ", at), std::string::npos) << out;
  EXPECT_NE(out.find("\n  after: ", at), std::string::npos) << out;
  const std::string rows = read_file_text(dir.str() + "/t/answers.jsonl");
  std::vector<nlohmann::json> answers;
  for (size_t b = 0, e; (e = rows.find('\n', b)) != std::string::npos; b = e + 1)
    answers.push_back(nlohmann::json::parse(rows.substr(b, e - b)));
  ASSERT_EQ(answers.size(), 2u) << rows;
  EXPECT_EQ(answers[1]["prompt"], "A fool");
  EXPECT_EQ(answers[1]["before_step"], 0);
  EXPECT_EQ(answers[1]["after_step"], 20);
  std::string generated;
  ASSERT_EQ(test::run_tightfit("generate " + recipe + " --prompts " + prompts + " -n 6 --greedy",
                               &generated),
            0)
      << generated;
  // (A tiny model may answer one prompt with spaces before and after: the
  // corpus's commonest byte. Some answer changes.)
  int changed = 0;
  for (const auto& a : answers) {
    EXPECT_NE(generated.find("### " + a["prompt"].get<std::string>() + "\n" +
                             a["after"].get<std::string>() + "\n"),
              std::string::npos)
        << generated << "\n"
        << rows;
    changed += a["before"] != a["after"];
  }
  EXPECT_GT(changed, 0) << "20 steps changed nothing?\n" << rows;
  const std::string bad = test::write_file(dir, "bad.jsonl", "{\"question\": \"x\"}\n");
  EXPECT_EQ(test::run_tightfit(
                "run " + recipe + " --set run.name=bad --set run.answer_prompts=" + bad, &out),
            2)
      << out;
  EXPECT_NE(out.find("[run] answer_prompts"), std::string::npos) << out;
  EXPECT_NE(out.find("needs \"messages\" or \"prompt\""), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir.path() / "bad" / "checkpoints")) << out;
}

// plan without --budget gives its verdict against the recipe's memory_budget.
TEST_F(CliTest, PlanJudgesAgainstTheRecipesOwnBudget) {
  std::string out;
  EXPECT_EQ(test::run_tightfit("plan " + recipe + " --set run.memory_budget=1MiB", &out), 3) << out;
  EXPECT_NE(out.find("budget        1.0MiB (run.memory_budget): does NOT fit"), std::string::npos)
      << out;
  EXPECT_EQ(test::run_tightfit("plan " + recipe + " --set run.memory_budget=4GiB", &out), 0) << out;
  EXPECT_NE(out.find("(run.memory_budget): fits"), std::string::npos) << out;
}

// plan says which precision is fast on this CPU, from matmuls it times now:
// a ratio of bf16's time to fp32's, and what it means for a 16-bit stack.
TEST_F(CliTest, PlanSaysWhichPrecisionIsFastOnThisCpu) {
  std::string out;
  ASSERT_EQ(test::run_tightfit("plan " + recipe, &out), 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      out, m,
      std::regex("precision     a bf16 matmul takes ([0-9.]+)x the time of an fp32 one on this "
                 "CPU \\([0-9]+ x 1024 x 1024, measured now\\): ([^\\n]+)")))
      << out;
  const double ratio = std::stod(m[1].str());
  EXPECT_GT(ratio, 0.0);
  const std::string verdict = ratio <= 0.9   ? "saves time here as well as memory"
                              : ratio <= 1.5 ? "saves memory here, not time"
                                             : "this CPU emulates bf16";
  EXPECT_NE(m[2].str().find(verdict), std::string::npos) << out;
  // --json stays the plan alone.
  ASSERT_EQ(test::run_tightfit("plan " + recipe + " --json 2>/dev/null", &out), 0) << out;
  EXPECT_EQ(out.find("bf16 matmul"), std::string::npos) << out;
}

// plan --add-strategy plans the recipe with the strategy appended, as run
// does: 8-bit AdamW's optimizer bytes are about a quarter of AdamW's.
TEST_F(CliTest, PlanTakesAddStrategyAsRunDoes) {
  auto optimizer_bytes = [&](const std::string& extra) {
    std::string out;
    EXPECT_EQ(test::run_tightfit("plan " + recipe + extra + " --json 2>/dev/null", &out), 0) << out;
    return nlohmann::json::parse(out)["at_peak"]["device"]["optimizer"].get<double>();
  };
  const double adamw = optimizer_bytes(""), adamw8 = optimizer_bytes(" --add-strategy adamw8");
  EXPECT_GT(adamw, 0);
  EXPECT_LT(adamw8, 0.3 * adamw) << adamw8 << " vs " << adamw;
  // With its key set through --set, as strategy.NAME.key.
  EXPECT_LT(optimizer_bytes(" --add-strategy adamw8 --set strategy.adamw8.state_block_size=64"),
            0.3 * adamw);
  std::string out;
  EXPECT_EQ(test::run_tightfit("plan " + recipe + " --add-strategy nosuch", &out), 2) << out;
  EXPECT_NE(out.find("nosuch"), std::string::npos) << out;
}

// A plugin hook that reports an error mid-training: the run stops with exit
// code 4, naming the plugin, the hook and its message; the checkpoint saved
// before stays loadable (the run resumes from it once the plugin stops failing).
TEST_F(CliTest, PluginErrorMidTrainingStopsCleanlyAndKeepsCheckpoints) {
  const std::string failing = std::string(TIGHTFIT_FIXTURE_DIR) + "/failing";
  const std::string text = test::tiny_recipe(test::write_corpus(dir), dir.str() + "/mid") +
                           "[save]\nevery = 2\n[[strategy]]\nplugin = \"failing_strategy\"\n"
                           "fail_at_step = 3\n";
  std::string with_path = text;
  with_path.replace(with_path.find("[run]\n"), 6, "[run]\nplugin_paths = [\"" + failing + "\"]\n");
  const std::string path = test::write_file(dir, "mid.toml", with_path);
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + path + " -q --set run.steps=6", &out), 4) << out;
  EXPECT_NE(
      out.find("plugin \"failing_strategy\" failed in step_begin: injected failure at step 3"),
      std::string::npos)
      << out;
  const fs::path checkpoints = fs::path(dir.str()) / "mid";
  bool saved = false;
  for (const auto& e : fs::recursive_directory_iterator(checkpoints))
    saved |= e.path().filename() == "step-00000002";
  EXPECT_TRUE(saved) << "no checkpoint of step 2 under " << checkpoints;
  ASSERT_EQ(test::run_tightfit("run " + path +
                                   " -q --resume --set run.steps=6 "
                                   "--set strategy.failing_strategy.fail_at_step=-1",
                               &out),
            0)
      << out;
  EXPECT_NE(out.find("steps         2 -> 6 of 6"), std::string::npos) << out;
}

// Out of budget: the run says what the plan expected and gives the fit
// command (its budget less what the data holds); that command writes a
// recipe planned within it.
TEST_F(CliTest, OutOfBudgetSuggestsAFitThatRuns) {
  ::setenv("TIGHTFIT_CACHE_DIR", dir.str().c_str(), 1);
  std::string text = test::tiny_recipe(test::write_corpus(dir), dir.str() + "/oom");
  text.replace(text.find("n_embd = 32"), 11, "n_embd = 256");
  text.replace(text.find("[run]\n"), 6, "[run]\nmemory_budget = \"12MiB\"\n");
  const std::string path = test::write_file(dir, "oom.toml", text);
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + path + " -q", &out), 3) << out;
  EXPECT_NE(out.find("planned peak"), std::string::npos) << out;
  const size_t at = out.find("to fit it     tightfit ");
  ASSERT_NE(at, std::string::npos) << out;
  const size_t args = at + std::string("to fit it     tightfit ").size();
  std::string fit = out.substr(args, out.find('\n', args) - args);
  const std::string fitted = dir.str() + "/fitted.toml";
  fit.replace(fit.find("fitted.toml"), 11, fitted);
  std::string fit_log;
  ASSERT_EQ(test::run_tightfit(fit, &fit_log), 0) << fit << "\n" << fit_log;
  EXPECT_NE(fit_log.find("written"), std::string::npos) << fit_log;
  // The written recipe plans within the suggested budget.
  const int64_t suggested = std::stoll(fit.substr(fit.find("--budget ") + 9));
  std::string json;
  ASSERT_EQ(test::run_tightfit("plan " + fitted + " --json 2>/dev/null", &json), 0) << json;
  const size_t peak = json.find("\"tracked_peak\": ");
  ASSERT_NE(peak, std::string::npos) << json;
  EXPECT_LE(std::stoll(json.substr(peak + 16)), suggested);
}

// A save that cannot be written (here a file size limit, as a full disk
// would) stops the run saying so; the checkpoint before stays listed and
// loadable, the partial folder is gone, and --resume continues from it.
TEST_F(CliTest, FailedSaveKeepsThePreviousCheckpoint) {
  std::string text =
      test::tiny_recipe(test::write_corpus(dir), dir.str() + "/full", "", "[save]\nevery = 2\n");
  text.replace(text.find("n_embd = 32"), 11, "n_embd = 128");
  text.replace(text.find("steps = 4"), 9, "steps = 6");
  const std::string path = test::write_file(dir, "full.toml", text);
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + path + " -q --stop-after 2", &out), 0) << out;
  // 500 KiB files at most: the model's file is larger. SIGXFSZ ignored, so
  // the write fails with EFBIG instead of killing the process.
  ASSERT_EQ(test::run_command("sh -c \"ulimit -f 1000; trap '' XFSZ; exec " +
                                  std::string(TIGHTFIT_BINARY) + " run " + path + " -q --resume\"",
                              &out),
            1)
      << out;
  EXPECT_NE(out.find("saving the checkpoint of step 4 failed"), std::string::npos) << out;
  EXPECT_NE(out.find("step-00000002 is intact"), std::string::npos) << out;
  const fs::path checkpoints = fs::path(dir.str()) / "full" / "t" / "checkpoints";
  for (const auto& e : fs::directory_iterator(checkpoints))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  ASSERT_EQ(test::run_tightfit("run " + path + " -q --resume", &out), 0) << out;
  EXPECT_NE(out.find("steps         2 -> 6 of 6"), std::string::npos) << out;
}

// An export that fails on a file size limit (as on a full disk; tightfit
// ignores SIGXFSZ itself, so the write fails instead of the process dying
// mid-file) says so and leaves no temporary file in the output folder: not
// the shard being written, nor the shards written before it.
TEST_F(CliTest, FailedExportLeavesNoTemporaryFiles) {
  std::string text = test::tiny_recipe(test::write_corpus(dir), dir.str() + "/exp");
  text.replace(text.find("n_embd = 32"), 11, "n_embd = 128");
  const std::string path = test::write_file(dir, "exp.toml", text);
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + path + " -q", &out), 0) << out;
  const fs::path hf = fs::path(dir.str()) / "hf";
  // Shards of 100 KB, files of 200 KiB at most: shards go until the one of
  // the MLP's 256 KiB matrix fails.
  EXPECT_NE(
      test::run_command("sh -c \"ulimit -f 400; exec " + std::string(TIGHTFIT_BINARY) + " export " +
                            path + " --out " + hf.string() + " --max-shard-size 100KB\"",
                        &out),
      0)
      << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  for (const auto& e : fs::directory_iterator(hf))
    EXPECT_EQ(e.path().filename().string().find("tmp"), std::string::npos) << e.path();
  // And with room, the same export completes.
  ASSERT_EQ(test::run_tightfit(
                "export " + path + " --out " + hf.string() + " --max-shard-size 100KB", &out),
            0)
      << out;
  EXPECT_TRUE(fs::exists(hf / "model.safetensors.index.json")) << out;
}

// A plugin that crashes the process (abort in a hook) loses nothing saved:
// the checkpoint before the crash resumes.
TEST_F(CliTest, PluginCrashLosesNothingSaved) {
  const std::string failing = std::string(TIGHTFIT_FIXTURE_DIR) + "/failing";
  std::string text = test::tiny_recipe(test::write_corpus(dir), dir.str() + "/crash") +
                     "[save]\nevery = 2\n[[strategy]]\nplugin = \"failing_strategy\"\n"
                     "crash_at_step = 3\n";
  text.replace(text.find("[run]\n"), 6, "[run]\nplugin_paths = [\"" + failing + "\"]\n");
  const std::string path = test::write_file(dir, "crash.toml", text);
  std::string out;
  EXPECT_NE(test::run_tightfit("run " + path + " -q --set run.steps=6", &out), 0) << out;
  ASSERT_EQ(test::run_tightfit("run " + path +
                                   " -q --resume --set run.steps=6 "
                                   "--set strategy.failing_strategy.crash_at_step=-1",
                               &out),
            0)
      << out;
  EXPECT_NE(out.find("steps         2 -> 6 of 6"), std::string::npos) << out;
}

// `plugins list --recipe` adds the recipe's plugin_paths with their origin;
// `plugins check` validates one file without running it, and refuses a
// broken one with the loader's message and exit code 4.
TEST_F(CliTest, PluginsListWithRecipeAndCheck) {
  const std::string v10 = std::string(TIGHTFIT_FIXTURE_DIR) + "/abi_v1_0";
  const std::string with_paths =
      test::write_file(dir, "paths.toml", "[run]\nplugin_paths = [\"" + v10 + "\"]\n");
  std::string out;
  ASSERT_EQ(test::run_tightfit("plugins list --recipe " + with_paths, &out), 0) << out;
  const size_t row = out.find("abi_v1_0_schedule");
  ASSERT_NE(row, std::string::npos) << out;
  const std::string line = out.substr(row, out.find('\n', row) - row);
  EXPECT_NE(line.find("schedule"), std::string::npos) << line;
  EXPECT_NE(line.find("1.0 "), std::string::npos) << line;
  EXPECT_NE(line.find("recipe"), std::string::npos) << line;
  EXPECT_NE(line.find(v10 + "/abi_v1_0_schedule.so"), std::string::npos) << line;
  const size_t builtin = out.find("\ngpt2 ");
  ASSERT_NE(builtin, std::string::npos) << out;
  EXPECT_NE(out.substr(builtin, out.find('\n', builtin + 1) - builtin).find("built-in"),
            std::string::npos);

  ASSERT_EQ(test::run_tightfit("plugins check " + v10 + "/abi_v1_0_schedule.so", &out), 0) << out;
  EXPECT_NE(out.find("ok "), std::string::npos) << out;
  EXPECT_NE(out.find("ABI 1.0"), std::string::npos) << out;
  EXPECT_NE(out.find("run_step, estimate_memory"), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit(
                "plugins check " + std::string(TIGHTFIT_FIXTURE_DIR) + "/fixture_wrong_libtorch.so",
                &out),
            4)
      << out;
  EXPECT_NE(out.find("built against LibTorch 1.0.0"), std::string::npos) << out;
}

// --add-strategy appends a [[strategy]] whose keys --set then reaches by name.
TEST_F(CliTest, AddStrategyAppendsATable) {
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe +
                                   " --dry-run --add-strategy checkpoint --set "
                                   "strategy.checkpoint.every=2 --add-strategy fused_update",
                               &out),
            0)
      << out;
  EXPECT_NE(out.find("2 strategies"), std::string::npos) << out;
  EXPECT_NE(out.find("recomputing 1 of 2 blocks"), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("run " + recipe + " --dry-run --add-strategy no_such_plugin", &out),
            2)
      << out;
  EXPECT_NE(out.find("no_such_plugin"), std::string::npos) << out;
}

TEST_F(CliTest, UnknownCommandIsAUsageError) {
  std::string out;
  EXPECT_EQ(test::run_tightfit("frobnicate", &out), 2) << out;
  EXPECT_NE(out.find("usage: tightfit"), std::string::npos) << out;
}

// What a newcomer types first: --version names the build, the plugin ABI and
// LibTorch; a recipe key written without --set is told the fix; generate's
// help shows its defaults as a user types them.
TEST_F(CliTest, VersionBareKeysAndHelpDefaultsSpeakTheUsersLanguage) {
  std::string out;
  ASSERT_EQ(test::run_tightfit("--version", &out), 0) << out;
  EXPECT_EQ(out.rfind("tightfit ", 0), 0u) << out;
  EXPECT_NE(out.find(" (plugin ABI " + std::to_string(TF_ABI_VERSION_MAJOR) + "." +
                     std::to_string(TF_ABI_VERSION_MINOR) + ", LibTorch " + TORCH_VERSION + ")\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(test::run_tightfit("run " + recipe + " run.steps=10", &out), 2) << out;
  EXPECT_NE(out.find("\"run.steps=10\" looks like a recipe key's new value: write it as --set "
                     "run.steps=10"),
            std::string::npos)
      << out;
  ASSERT_EQ(test::run_tightfit("generate --help", &out), 0) << out;
  EXPECT_NE(out.find("(='\\n')"), std::string::npos) << out;
  EXPECT_NE(out.find("(=0.8)"), std::string::npos) << out;
  EXPECT_EQ(out.find("0.80000"), std::string::npos) << out;
  EXPECT_EQ(out.find("(=\n"), std::string::npos) << out;
}

// A warmup longer than the run: the learning rate never reaches optimizer.lr,
// said at the start (the tiny recipe warms up for 2 steps).
TEST_F(CliTest, AWarmupLongerThanTheRunIsWarnedAtTheStart) {
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --set run.steps=1 --set run.name=w", &out), 0)
      << out;
  EXPECT_NE(out.find("[schedule] warmup_steps = 2 is longer than the run's 1 steps: the learning "
                     "rate climbs to 0.5 x optimizer.lr at the last step and never reaches it"),
            std::string::npos)
      << out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --set run.name=ok", &out), 0) << out;
  EXPECT_EQ(out.find("warmup_steps"), std::string::npos) << out;
}

// `tightfit` with a pseudo-terminal as its output, as a person at a terminal
// runs it: what it wrote and its exit code.
std::pair<std::string, int> run_in_terminal(const std::vector<std::string>& args) {
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(TIGHTFIT_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(TIGHTFIT_BINARY, argv.data());
    ::_exit(127);
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) out.append(buf, n);  // EIO at the end
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// Long phases show a line that updates in place on a terminal (building the
// model, generating token by token, exporting weight by weight), and nothing
// of it in a pipe or with -q.
TEST_F(CliTest, PhasesShowProgressOnATerminalAndNotInAPipe) {
  const auto [run, run_rc] = run_in_terminal({"run", recipe});
  ASSERT_EQ(run_rc, 0) << run;
  EXPECT_NE(run.find("\r\033[Kbuilding the model: 0 of "), std::string::npos) << run;
  const auto [quiet, quiet_rc] = run_in_terminal({"run", recipe, "-q", "--set", "run.name=q"});
  ASSERT_EQ(quiet_rc, 0) << quiet;
  EXPECT_EQ(quiet.find("building the model"), std::string::npos) << quiet;
  const auto [gen, gen_rc] =
      run_in_terminal({"generate", recipe, "-p", "Hello", "-n", "20", "--greedy"});
  ASSERT_EQ(gen_rc, 0) << gen;
  EXPECT_NE(gen.find("\r\033[Kgenerating: 0 of 20 tokens (0%)"), std::string::npos) << gen;
  const auto [exp, exp_rc] = run_in_terminal({"export", recipe, "--out", dir.str() + "/hf"});
  ASSERT_EQ(exp_rc, 0) << exp;
  EXPECT_NE(exp.find("\r\033[Kexporting: 0 of "), std::string::npos) << exp;
  // In a pipe: none of it.
  std::string piped;
  ASSERT_EQ(test::run_tightfit("generate " + recipe + " -p Hello -n 20 --greedy", &piped), 0);
  EXPECT_EQ(piped.find("generating:"), std::string::npos) << piped;
  EXPECT_EQ(piped.find("\033[K"), std::string::npos) << piped;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --set run.name=p", &piped), 0);
  EXPECT_EQ(piped.find("building the model"), std::string::npos) << piped;
}

// A recipe copied out of configs/ says at --dry-run which relative path it
// can no longer find, key by key (a dry run read no data before, so a missing
// corpus or answer_prompts file was found only when the run came to it).
TEST_F(CliTest, ACopiedRecipeSaysAtDryRunWhichPathItCannotFind) {
  std::string out;
  const std::string copied = dir.str() + "/copied.toml";
  std::filesystem::copy_file(std::string(TIGHTFIT_SOURCE_DIR) + "/configs/default.toml", copied);
  EXPECT_EQ(test::run_tightfit("run " + copied + " --dry-run", &out), 2) << out;
  // The model's GGUF first, or (where the working directory has it) the data.
  EXPECT_TRUE(out.find("SmolLM2-135M-Instruct.Q4_1.gguf: cannot open") != std::string::npos ||
              out.find("corpus = \"data/persona-train.jsonl\" is not there") != std::string::npos)
      << out;
  const std::string text = read_file_text(recipe);
  const std::string moved = test::write_file(
      dir, "moved.toml",
      std::regex_replace(text, std::regex("corpus = \"[^\"]*\""), "corpus = \"data/rows.jsonl\""));
  EXPECT_EQ(test::run_tightfit("run " + moved + " --dry-run", &out), 2) << out;
  EXPECT_NE(out.find("[data] corpus = \"data/rows.jsonl\" is not there (looked in the working "
                     "directory and in the recipe's folder " +
                     dir.str()),
            std::string::npos)
      << out;
  const std::string asks =
      test::write_file(dir, "asks.toml",
                       std::regex_replace(text, std::regex("\\[run\\]\n"),
                                          "[run]\nanswer_prompts = \"data/questions.txt\"\n"));
  EXPECT_EQ(test::run_tightfit("run " + asks + " --dry-run", &out), 2) << out;
  EXPECT_NE(out.find("[run] answer_prompts = \"data/questions.txt\" is not there"),
            std::string::npos)
      << out;
  EXPECT_EQ(test::run_tightfit("run " + recipe + " --dry-run", &out), 0) << out;
}

// One table gives the usage text and the dispatch: every command the usage
// lists is one `tightfit` runs, whose --help answers with its own options.
TEST_F(CliTest, EveryCommandTheUsageListsAnswersItsHelp) {
  std::string usage;
  ASSERT_EQ(test::run_tightfit("--help", &usage), 0) << usage;
  std::vector<std::string> listed;
  std::istringstream lines(usage.substr(usage.find("commands:")));
  for (std::string line; std::getline(lines, line);)
    if (line.size() > 2 && line.rfind("  ", 0) == 0 && line[2] != ' ') {
      const std::string name = line.substr(2, line.find(' ', 2) - 2);
      if (std::find(listed.begin(), listed.end(), name) == listed.end()) listed.push_back(name);
    }
  EXPECT_EQ(listed, (std::vector<std::string>{"run", "generate", "export", "ab", "plan", "fit",
                                              "plugins"}));
  for (const std::string& name : listed) {
    std::string out;
    const std::string args = name == "plugins" ? "plugins --help" : name + " --help";
    EXPECT_EQ(test::run_tightfit(args, &out), 0) << name << ": " << out;
    EXPECT_NE(out.find("tightfit " + name), std::string::npos) << name << ": " << out;
    EXPECT_EQ(out.find("unknown command"), std::string::npos) << name << ": " << out;
  }
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// A recipe for a model folder the user brings (config = weights = "MODEL"):
// checked with the shape of the model it names and the byte tokenizer.
std::string model_folder_stand_in(const std::filesystem::path& recipe) {
  return recipe.filename() == "fine-tune.toml"
             ? " --set model.plugin=llama --set model.config= --set model.preset=qwen2-1.5B "
               "--set data.tokenizer=byte --set data.corpus=builtin:fortunes"
             : "";
}

// The documented fine-tune recipe, run as docs/fine-tune.md says on a small
// Qwen2 folder and chat rows: it trains, keeps checkpoints, and writes a
// folder transformers loads and an adapter PEFT loads onto the base.
TEST(Configs, TheFineTuneRecipeKeepsWhatItTrained) {
  test::TempDir d;
  const std::string model = d.str() + "/model", chat = d.str() + "/chat.jsonl";
  const std::string py = test::peer_python() + " ";
  ASSERT_EQ(std::system((py + TIGHTFIT_SOURCE_DIR + "/tests/peers/make_hf_folder.py make " + model +
                         " " + chat)
                            .c_str()),
            0);
  std::string out;
  ASSERT_EQ(
      test::run_tightfit(
          "run " + std::string(TIGHTFIT_SOURCE_DIR) +
              "/configs/fine-tune.toml -q --set model.config=" + model + " --set model.weights=" +
              model + " --set data.corpus=" + chat + " --set run.out_dir=" + d.str() +
              "/runs --set run.steps=4 --set save.every=2 --set data.seq_len=64 "
              "--set data.batch_size=2 --set schedule.micro_batches=2 --set run.eval_interval=0",
          &out),
      0)
      << out;
  const std::string run = d.str() + "/runs/fine-tune";
  for (const char* f : {"checkpoints/step-00000002", "checkpoints/step-00000004", "hf/config.json",
                        "hf/tokenizer.json", "hf/tokenizer_config.json",
                        "adapter/adapter_config.json", "adapter/adapter_model.safetensors"})
    EXPECT_TRUE(std::filesystem::exists(run + "/" + f)) << f << "\n" << out;
  const std::string load =
      py +
      "-c \"import sys; from transformers import AutoModelForCausalLM as M; "
      "from peft import AutoPeftModelForCausalLM as P; M.from_pretrained(sys.argv[1]); "
      "P.from_pretrained(sys.argv[2])\" " +
      run + "/hf " + run + "/adapter";
  EXPECT_EQ(std::system(load.c_str()), 0) << "transformers or PEFT could not load the results";
}

// plugin = "auto" takes the model plugin from the model_type of the
// config.json that [model] config names, a folder or a GGUF file, as
// transformers' AutoModel picks a class: one fine-tune recipe for every
// family. A type no plugin computes, or no config to read it from, is
// refused naming the fix.
TEST(Configs, AutoPicksTheModelPluginFromTheFoldersModelType) {
  test::TempDir d;
  auto folder = [&](const std::string& name, const std::string& config) {
    std::filesystem::create_directories(d.str() + "/" + name);
    test::write_file(d, name + "/config.json", config);
    return d.str() + "/" + name;
  };
  const std::string gpt2 = folder("gpt2", R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 32,
      "n_head": 2, "n_positions": 64, "vocab_size": 256})");
  const std::string llama = folder("llama", R"({"model_type": "llama", "num_hidden_layers": 2,
      "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
      "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": 64})");
  const std::string other = folder("other", R"({"model_type": "bloom"})");
  auto recipe = [&](const std::string& config) {
    return test::write_file(d, "r.toml",
                            "[run]\nsteps = 1\n[model]\nplugin = \"auto\"\n" +
                                (config.empty() ? "" : "config = \"" + config + "\"\n") +
                                "[data]\ntokenizer = \"byte\"\ncorpus = \"builtin:fortunes\"\n"
                                "seq_len = 32\nbatch_size = 2\n");
  };
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe(gpt2) + " --dry-run", &out), 0) << out;
  EXPECT_NE(out.find("valid; model gpt2"), std::string::npos) << out;
  ASSERT_EQ(test::run_tightfit("run " + recipe(llama) + " --dry-run", &out), 0) << out;
  EXPECT_NE(out.find("valid; model llama"), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("run " + recipe(other) + " --dry-run", &out), 2) << out;
  EXPECT_NE(out.find("has model_type \"bloom\", which no installed model plugin computes "
                     "(installed: "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("gpt2"), std::string::npos) << out;
  EXPECT_EQ(test::run_tightfit("run " + recipe("") + " --dry-run", &out), 2) << out;
  EXPECT_NE(out.find("plugin = \"auto\" takes the model plugin from the model_type"),
            std::string::npos)
      << out;
  EXPECT_EQ(test::run_tightfit("run " + recipe("MODEL") + " --dry-run", &out), 2) << out;
  EXPECT_NE(out.find("config = \"MODEL\" is not there"), std::string::npos) << out;
  EXPECT_NE(out.find("--set model.config=PATH"), std::string::npos) << out;
}

// docs/recipes.md's key reference is the binary's key schema, word for word.
TEST(Configs, RecipesPageListsEveryKey) {
  std::string out;
  ASSERT_EQ(test::run_tightfit("plugins keys", &out), 0) << out;
  const std::string page = read_file_text(std::string(TIGHTFIT_SOURCE_DIR) + "/docs/recipes.md");
  const std::string begin = "<!-- keys:begin -->\n", end = "<!-- keys:end -->";
  const auto b = page.find(begin), e = page.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(page.substr(b + begin.size(), e - b - begin.size()), out)
      << "docs/recipes.md's key reference differs from `tightfit plugins keys`: regenerate it";
  for (const char* table : {"### [run]", "### [data]", "### [save]", "plugin = \"lora\""})
    EXPECT_NE(out.find(table), std::string::npos) << table;
}

// Every shipped recipe is valid: tables, keys, plugins and their configuration.
TEST(Configs, EveryShippedRecipeValidates) {
  int checked = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(
           std::string(TIGHTFIT_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".toml") continue;
    std::string out;
    // The fine-tune recipe needs the folder llama-tiny.toml writes; check it with a stand-in shape.
    const bool needs_folder = e.path().filename() == "llama-finetune.toml";
    std::string extra = needs_folder ? " --set model.config= --set model.preset=tiny" : "";
    extra += model_folder_stand_in(e.path());
    // GPU recipes are checked on this machine's CPU when it has no GPU.
    const Recipe recipe = Recipe::load(e.path().string());
    if (!at::hasCUDA() &&
        (*recipe.table("run"))["device"].value_or(std::string("cpu")).rfind("cuda", 0) == 0) {
      extra += " --set run.device=cpu";
      for (const toml::table* t : recipe.array_tables("strategy"))
        if (t->contains("devices")) extra += " --set 'strategy.shard.devices=[\"cpu\",\"cpu\"]'";
    }
    if (needs_folder) {
      Recipe r = Recipe::load(e.path().string());
      EXPECT_NE(r.table("model")->get("weights"), nullptr);
      continue;
    }
    EXPECT_EQ(test::run_tightfit("run " + e.path().string() + " --dry-run" + extra, &out), 0)
        << e.path() << "\n"
        << out;
    EXPECT_NE(out.find("valid; model"), std::string::npos) << out;
    ++checked;
  }
  EXPECT_GE(checked, 7);
}

// A shipped recipe that names a memory budget fits it as `tightfit plan`
// predicts — GPU recipes included, planned here without the GPU.
TEST(Configs, EveryShippedBudgetIsMetByThePlan) {
  int checked = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(
           std::string(TIGHTFIT_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".toml") continue;
    const Recipe recipe = Recipe::load(e.path().string());
    const auto budget = (*recipe.table("run"))["memory_budget"].value<std::string>();
    if (!budget) continue;
    std::string out;
    EXPECT_EQ(test::run_tightfit("plan " + e.path().string() + " --budget " + *budget +
                                     model_folder_stand_in(e.path()),
                                 &out),
              0)
        << e.path() << "\n"
        << out;
    EXPECT_NE(out.find(": fits,"), std::string::npos) << out;
    ++checked;
  }
  EXPECT_GE(checked, 11);
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// `plan --longest-context`: the longest seq_len whose plan fits the budget,
// to 256 tokens (the length 256 longer does not), stopped by the model's
// positions where it refuses longer; `plan` prints the per-token slope and
// the fixed part, which add up to the peak.
TEST(PlanLongestContext, TheLongestLengthThatFitsAndWhatATokenCosts) {
  test::TempDir dir;
  std::string r = test::tiny_recipe(test::write_corpus(dir), dir.str());
  const auto begin = r.find("[model]"), end = r.find("[data]");
  r.replace(begin, end - begin,
            "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 64\n"
            "n_head = 4\nintermediate_size = 256\nmax_positions = 8192\n\n");
  const std::string recipe = test::write_file(dir, "r.toml", r);
  auto peak_at = [&](int64_t tokens) {
    std::string out;
    EXPECT_EQ(test::run_tightfit(
                  "plan " + recipe + " --json --set data.seq_len=" + std::to_string(tokens), &out),
              0)
        << out;
    return nlohmann::json::parse(out.substr(out.find('{')))["device_peak"].get<int64_t>();
  };
  const int64_t budget = peak_at(1500);
  std::string out;
  ASSERT_EQ(test::run_tightfit(
                "plan " + recipe + " --longest-context --budget " + std::to_string(budget), &out),
            0)
      << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("longest context  ([0-9]+) tokens"))) << out;
  const int64_t longest = std::stoll(m[1]);
  EXPECT_EQ(longest % 256, 0) << out;
  EXPECT_LE(peak_at(longest), budget) << out;
  EXPECT_GT(peak_at(longest + 256), budget) << out;
  EXPECT_GE(longest, 1280) << out;
  // Past the model's positions: the search stops there and says why.
  ASSERT_EQ(test::run_tightfit("plan " + recipe + " --longest-context --budget 1TiB", &out), 0)
      << out;
  EXPECT_NE(out.find("longest context  8192 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("longer was refused"), std::string::npos) << out;
  // No budget: refused, naming the two ways to give one.
  EXPECT_EQ(test::run_tightfit("plan " + recipe + " --longest-context", &out), 2) << out;
  EXPECT_NE(out.find("--budget 16GiB"), std::string::npos) << out;
  ASSERT_EQ(test::run_tightfit("plan " + recipe + " --set data.seq_len=2048", &out), 0) << out;
  ASSERT_TRUE(std::regex_search(
      out, m, std::regex("per token     ([0-9.]+)KiB a token of seq_len .*fixed ([0-9.]+)MiB")))
      << out;
  const double predicted = std::stod(m[1]) * 1024 * 2048 + std::stod(m[2]) * 1024 * 1024;
  EXPECT_NEAR(predicted, static_cast<double>(peak_at(2048)), 0.01 * peak_at(2048)) << out;
}

}  // namespace
}  // namespace tightfit
