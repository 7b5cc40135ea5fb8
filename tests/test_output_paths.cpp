// No output of a run replaces or writes through a file the run reads, and
// no file tightfit writes in place is written through another hard link to
// it (issue 63): exports at the base weights, the data or the recipe, by
// path, symlink or hard link, are refused naming both (exit 2 at the
// command line), and the lock and metrics.jsonl leave a linked file as it was.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "file_util.hpp"
#include "input_files.hpp"
#include "metrics.hpp"
#include "run_folder_lock.hpp"
#include "session.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace tightfit {
namespace {

std::string lines_of(const std::string& path) {
  return read_file_text(path);
}

void expect_refused(const std::function<void()>& write, const std::string& says) {
  try {
    write();
    ADD_FAILURE() << "an output was written over an input (expected: " << says << ")";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("choose another"), std::string::npos) << e.what();
  }
}

TEST(OutputPaths, AnExportNeverReplacesWhatTheRunReads) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  test::make_session(test::tiny_recipe(corpus, d.str()))->export_hf(d.str() + "/base", false);
  const std::string base = d.str() + "/base", weights = base + "/model.safetensors";
  const std::string weights_before = lines_of(weights), corpus_before = lines_of(corpus);
  auto s = test::make_session(
      test::tiny_recipe(corpus, d.str() + "/out", "weights = \"" + base + "\"\n",
                        "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8.0\n"));

  // The base's folder, its weights file, by another spelling.
  expect_refused([&] { s->export_hf(base, true); }, "is the base weights folder " + base);
  expect_refused([&] { s->export_adapter(base); }, "is the base weights folder");
  expect_refused([&] { s->export_gguf(weights, "f32"); }, "is the base weights " + weights);
  expect_refused([&] { s->export_adapter_gguf(weights, "f32"); }, "the adapter to " + weights);
  expect_refused([&] { s->export_gguf(d.str() + "/base/../base/config.json", "f32"); },
                 "is the same file as the base weights");
  // A symlink to the weights, a hard link to the data.
  fs::create_symlink(weights, d.path() / "link.gguf");
  expect_refused([&] { s->export_gguf(d.str() + "/link.gguf", "f32"); },
                 "links to the base weights");
  ASSERT_EQ(::link(corpus.c_str(), (d.str() + "/data.gguf").c_str()), 0);
  expect_refused([&] { s->export_adapter_gguf(d.str() + "/data.gguf", "f32"); },
                 "is the same file as the data");
  // A folder that holds the base's files (its own folder, by a link).
  fs::create_directory_symlink(base, d.path() / "base-link");
  expect_refused([&] { s->export_hf(d.str() + "/base-link", true); }, "links to the base weights");

  EXPECT_EQ(lines_of(weights), weights_before);
  EXPECT_EQ(lines_of(corpus), corpus_before);
  EXPECT_TRUE(fs::is_symlink(d.path() / "link.gguf"));  // the link itself is left as it was
  // Anywhere else is written.
  EXPECT_NO_THROW(s->export_adapter(d.str() + "/adapter"));
  EXPECT_TRUE(fs::exists(d.path() / "adapter" / "adapter_model.safetensors"));
}

// The command line says it as an input error: exit 2, the base untouched.
TEST(OutputPaths, TheExportCommandRefusesTheBaseWithExitTwo) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  test::make_session(test::tiny_recipe(corpus, d.str()))->export_hf(d.str() + "/base", false);
  const std::string weights = d.str() + "/base/model.safetensors";
  const std::string before = lines_of(weights);
  const std::string recipe = test::write_file(
      d, "lora.toml",
      test::tiny_recipe(corpus, d.str() + "/out", "weights = \"" + d.str() + "/base\"\n",
                        "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8.0\n"
                        "[save]\nfinal = true\n"));
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --set run.steps=1 -q", &out), 0) << out;
  EXPECT_EQ(test::run_tightfit("export " + recipe + " --adapter --out " + weights, &out), 2) << out;
  EXPECT_NE(out.find("is the base weights " + weights), std::string::npos) << out;
  EXPECT_EQ(lines_of(weights), before);
  EXPECT_EQ(test::run_tightfit("export " + recipe + " --out " + d.str() + "/base", &out), 2) << out;
  EXPECT_EQ(lines_of(weights), before);
}

// The rule as a property: for every command that writes a file or folder the
// user names (export as a folder, a GGUF file, an adapter folder or GGUF;
// fit's recipe), an output at any input the command reads (the recipe, the
// data, the base weights file, another file of the base's folder, the
// folder itself, the checkpoint's weights), spelled as its path, through
// "..", by a symbolic link or a hard link, is refused with exit 2 and every
// input keeps its bytes. Cases drawn with a fixed seed, every command and
// input among them (fit reads no checkpoint, so that one is export's).
TEST(OutputPaths, EveryWritingCommandRefusesEveryInputByEverySpelling) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  test::make_session(test::tiny_recipe(corpus, d.str()))->export_hf(d.str() + "/base", false);
  const std::string base = d.str() + "/base";
  const std::string recipe =
      test::write_file(d, "lora.toml",
                       test::tiny_recipe(corpus, d.str() + "/out", "weights = \"" + base + "\"\n",
                                         "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8.0\n"
                                         "[save]\nfinal = true\n"));
  std::string log;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --set run.steps=1 -q", &log), 0) << log;
  const std::string checkpoint = d.str() + "/out/t/checkpoints/step-00000001";
  ASSERT_TRUE(fs::exists(checkpoint)) << log;
  std::string checkpoint_weights;
  for (const auto& e : fs::directory_iterator(checkpoint))
    if (e.path().extension() == ".safetensors") checkpoint_weights = e.path().string();
  ASSERT_FALSE(checkpoint_weights.empty());

  struct Input {
    std::string path;
    bool folder;
  };
  const std::vector<Input> inputs = {{recipe, false},
                                     {corpus, false},
                                     {base + "/model.safetensors", false},
                                     {base + "/config.json", false},
                                     {base, true},
                                     {checkpoint_weights, false}};
  std::vector<std::pair<std::string, std::string>> before;
  for (const Input& in : inputs)
    if (!in.folder) before.emplace_back(in.path, lines_of(in.path));
  const std::vector<std::string> commands = {"export " + recipe + " --out ",
                                             "export " + recipe + " --adapter --out ",
                                             "fit " + recipe + " --budget 1GiB --out "};
  enum Spelling { kPath, kDotDot, kSymlink, kHardLink };
  std::mt19937 draw(63);
  int links = 0, ran = 0;
  std::vector<bool> command_seen(commands.size()), input_seen(inputs.size());
  for (int k = 0; k < 40 && ran < 18; ++k) {
    const size_t c = draw() % commands.size(), i = draw() % inputs.size();
    const auto spelling = static_cast<Spelling>(draw() % 4);
    // Each command and input once before any repeats.
    if (k < 12 && command_seen[c] && input_seen[i]) continue;
    const Input& in = inputs[i];
    if (in.folder && spelling == kHardLink) continue;  // folders have no hard links
    if (c == 2 && (in.folder || i == 5)) continue;     // fit writes a file, reads no checkpoint
    std::string out = in.path;
    const fs::path p(in.path);
    if (spelling == kDotDot)
      out = (p.parent_path() / ".." / p.parent_path().filename() / p.filename()).string();
    // A link named .gguf (a file output the export writes as GGUF) or as the folder.
    const std::string name =
        d.str() + "/link" + std::to_string(++links) + (in.folder || c == 2 ? "" : ".gguf");
    if (spelling == kSymlink) {
      fs::create_symlink(in.path, name);
      out = name;
    }
    if (spelling == kHardLink) {
      ASSERT_EQ(::link(in.path.c_str(), name.c_str()), 0);
      out = name;
    }
    ++ran;
    command_seen[c] = input_seen[i] = true;
    SCOPED_TRACE(commands[c] + out);
    EXPECT_EQ(test::run_tightfit(commands[c] + out, &log), 2) << log;
    EXPECT_NE(log.find("choose another"), std::string::npos) << log;
    for (const auto& [path, bytes] : before) EXPECT_EQ(lines_of(path), bytes) << path;
    if (spelling == kSymlink) {
      EXPECT_TRUE(fs::is_symlink(out));
    }
  }
  EXPECT_GE(ran, 12);
  for (size_t c = 0; c < commands.size(); ++c) EXPECT_TRUE(command_seen[c]) << commands[c];
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_TRUE(input_seen[i]) << inputs[i].path;
}

// A hard link planted at metrics.jsonl or at the run folder's lock: the run
// writes files of its own there, and the linked file keeps its bytes; a
// resumed run's rows kept go to a file of its own too. (A symlink there is
// an input error: UsersFiles.MetricsStartFreshAndNeverFollowALink.)
TEST(OutputPaths, AHardLinkAtTheMetricsOrTheLockIsNeverWrittenThrough) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  const std::string precious = test::write_file(d, "precious.txt", "do not touch\n");
  const std::string precious2 = test::write_file(d, "precious2.txt", "nor this\n");
  fs::create_directories(d.path() / "t");
  ASSERT_EQ(::link(precious.c_str(), (d.str() + "/t/metrics.jsonl").c_str()), 0);
  ASSERT_EQ(::link(precious2.c_str(), (d.str() + "/t/" + RunFolderLock::kFileName).c_str()), 0);
  test::make_session(test::tiny_recipe(corpus, d.str()))->train();
  EXPECT_EQ(lines_of(precious), "do not touch\n");
  EXPECT_EQ(lines_of(precious2), "nor this\n");
  struct stat st {};
  ASSERT_EQ(::stat((d.str() + "/t/metrics.jsonl").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);
  EXPECT_NE(lines_of(d.str() + "/t/metrics.jsonl").find("\"step\""), std::string::npos);

  // Resumed at step 2: the rows of steps 1..2 kept, in a file of its own.
  std::string rows;
  for (int step = 1; step <= 4; ++step)
    rows += "{\"step\": " + std::to_string(step) + ", \"loss\": 9.0}\n";
  const std::string shared = test::write_file(d, "shared.jsonl", rows);
  const std::string path = d.str() + "/resumed.jsonl";
  ASSERT_EQ(::link(shared.c_str(), path.c_str()), 0);
  {
    MetricsWriter w(path, /*resumed_at_step=*/2);
    EXPECT_TRUE(w.write({{"step", 3}, {"loss", 1.0}}));
  }
  EXPECT_EQ(lines_of(shared), rows);
  const std::string kept = lines_of(path);
  EXPECT_EQ(std::count(kept.begin(), kept.end(), '\n'), 3);
  EXPECT_EQ(kept.rfind("{\"step\": 1, \"loss\": 9.0}\n{\"step\": 2, \"loss\": 9.0}\n", 0), 0u);
}

}  // namespace
}  // namespace tightfit
