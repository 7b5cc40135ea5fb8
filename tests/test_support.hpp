// Helpers shared by the test suites: temporary folders, a small corpus, a
// tiny GPT-2 recipe, and sessions built from recipe text.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "session.hpp"

namespace tightfit::test {

// A fresh folder under the system temp dir, removed at scope end.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// Writes a small deterministic English-like corpus and returns its path.
std::string write_corpus(const TempDir& dir);

// The device the suites labelled "cuda" run on: TIGHTFIT_TEST_DEVICE
// (cuda:0 when scripts/gpu-check runs them on the GPU), or "" for the CPU.
std::string test_device();
// On a CUDA test device the kernel counts device memory as the caching
// allocator's totals only, not by category (docs/gpu.md): assertions on a
// category's bytes hold on the CPU. Why, for a GTEST_SKIP, or empty on a CPU.
std::string categories_not_counted_here();

// A tiny GPT-2 recipe training on `corpus` with output under `out_dir`;
// `extra` is appended verbatim (strategies, overrides of tables).
std::string tiny_recipe(const std::string& corpus, const std::string& out_dir,
                        const std::string& model_extra = "", const std::string& extra = "");

// The installed plugins (built-in folder), discovered once.
const PluginRegistry& registry();

std::unique_ptr<Session> make_session(const std::string& recipe_text, SessionOptions options = {},
                                      const std::string& name = "recipe.toml");

// The RecipeError message building a session from `text` (named my.toml)
// throws; a test failure when it builds.
std::string recipe_error(const std::string& text);

// Every gradient in `b` within `tolerance` of `a`'s, relative to its
// largest value; the same names in both, and some.
void expect_same_grads(const std::map<std::string, at::Tensor>& a,
                       const std::map<std::string, at::Tensor>& b, double tolerance);

// Writes `text` to dir/name and returns the path.
std::string write_file(const TempDir& dir, const std::string& name, const std::string& text);

// Runs a shell command; returns its exit code and combined output.
int run_command(const std::string& command, std::string* output);

// Runs the tightfit binary with `args`; returns the exit code and combined output.
int run_tightfit(const std::string& args, std::string* output);

// The command that runs a Python peer (tests/peers) as the project's .venv
// Python would: through run_peer.py, which hands it to ctest's peer server
// (tests/peers/peer_server.py: torch, transformers, PEFT and TRL imported
// once) when one answers, and runs it directly otherwise.
std::string peer_python();

// A [model] table for the llama plugin shaped by tests/fixtures/NAME/config.json.
std::string fixture_model(const std::string& name);
// A [model] table for a Mixtral of 16 experts, one per token (3 blocks, 32
// wide), written as a config.json under `dir`: a batch of a few tokens leaves
// experts without any in every block.
std::string many_experts_model(const TempDir& dir);

}  // namespace tightfit::test
