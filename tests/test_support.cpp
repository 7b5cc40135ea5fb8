#include "test_support.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "file_util.hpp"
#include "logging.hpp"

namespace tightfit::test {
namespace fs = std::filesystem;

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "tightfit-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  try {
    remove_tree(path_.string());
  } catch (const std::exception&) {
  }
}

std::string write_file(const TempDir& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir.path() / name;
  std::ofstream(p) << text;
  return p.string();
}

std::string write_corpus(const TempDir& dir) {
  static const char* words[] = {"the",   "cat",    "sat",   "on",    "a",    "mat",
                                "and",   "dog",    "ran",   "after", "it",   "while",
                                "birds", "sang",   "in",    "trees", "over", "green",
                                "hill",  "slowly", "quick", "brown", "fox",  "jumps"};
  std::mt19937 rng(7);
  std::ostringstream os;
  for (int s = 0; s < 3000; ++s) {
    const int n = 4 + static_cast<int>(rng() % 8);
    for (int w = 0; w < n; ++w)
      os << (w ? " " : "") << words[rng() % (sizeof(words) / sizeof(words[0]))];
    os << ".\n";
  }
  return write_file(dir, "corpus.txt", os.str());
}

std::string categories_not_counted_here() {
  if (test_device().rfind("cuda", 0) != 0) return {};
  return "device memory is counted as the caching allocator's totals, not by category "
         "(docs/gpu.md): this category's bytes are checked on the CPU";
}

std::string test_device() {
  const char* device = std::getenv("TIGHTFIT_TEST_DEVICE");
  return device ? device : "";
}

std::string tiny_recipe(const std::string& corpus, const std::string& out_dir,
                        const std::string& model_extra, const std::string& extra) {
  std::ostringstream os;
  // scripts/gpu-check runs the suites labelled "cuda" with
  // TIGHTFIT_TEST_DEVICE=cuda:0: the same comparisons on the GPU.
  const std::string device = test_device();
  os << "[run]\n";
  if (!device.empty()) os << "device = \"" << device << "\"\n";
  os << "name = \"t\"\nseed = 7\nsteps = 4\nout_dir = \"" << out_dir
     << "\"\nsample_tokens = 0\neval_batches = 1\nlog_every = 1000\n\n"
     << "[model]\nplugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = "
        "2\nn_positions = 64\n"
     << model_extra << "\n"
     << "[data]\ncorpus = \"" << corpus
     << "\"\ntokenizer = \"byte\"\nseq_len = 32\nbatch_size = 4\n\n"
     << "[optimizer]\nlr = 1e-3\n\n"
     << "[schedule]\nplugin = \"standard\"\nwarmup_steps = 2\n\n"
     << extra;
  return os.str();
}

void expect_same_grads(const std::map<std::string, at::Tensor>& a,
                       const std::map<std::string, at::Tensor>& b, double tolerance) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (const auto& [name, g] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    const at::Tensor& h = b.at(name);
    const double scale = g.abs().max().item<double>() + 1e-30;
    const double diff = (g.to(at::kDouble) - h.to(at::kDouble)).abs().max().item<double>();
    EXPECT_LE(diff / scale, tolerance) << name;
  }
}

const PluginRegistry& registry() {
  static const PluginRegistry reg = [] {
    set_log_level("warn");
    return PluginRegistry::discover();
  }();
  return reg;
}

std::unique_ptr<Session> make_session(const std::string& recipe_text, SessionOptions options,
                                      const std::string& name) {
  return std::make_unique<Session>(Recipe::parse(recipe_text, name), registry(),
                                   std::move(options));
}

std::string recipe_error(const std::string& text) {
  try {
    make_session(text, {}, "my.toml");
  } catch (const RecipeError& e) {
    return e.what();
  }
  ADD_FAILURE() << "recipe was accepted:\n" << text;
  return {};
}

int run_command(const std::string& command, std::string* output) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf{};
  std::string out;
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int run_tightfit(const std::string& args, std::string* output) {
  return run_command(std::string(TIGHTFIT_BINARY) + " " + args, output);
}

std::string peer_python() {
  return std::string(TIGHTFIT_SOURCE_DIR) + "/.venv/bin/python -S " + TIGHTFIT_SOURCE_DIR +
         "/tests/peers/run_peer.py";
}

std::string fixture_model(const std::string& name) {
  return "plugin = \"llama\"\nconfig = \"" + std::string(TIGHTFIT_SOURCE_DIR) + "/tests/fixtures/" +
         name + "\"\n";
}

std::string many_experts_model(const TempDir& dir) {
  const nlohmann::json config = {{"model_type", "mixtral"},  {"num_hidden_layers", 3},
                                 {"hidden_size", 32},        {"num_attention_heads", 4},
                                 {"num_key_value_heads", 2}, {"intermediate_size", 48},
                                 {"vocab_size", 256},        {"max_position_embeddings", 64},
                                 {"num_local_experts", 16},  {"num_experts_per_tok", 1}};
  const std::string folder = dir.str() + "/mixtral16";
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/config.json") << config.dump();
  return "plugin = \"llama\"\nconfig = \"" + folder + "\"\n";
}

}  // namespace tightfit::test
