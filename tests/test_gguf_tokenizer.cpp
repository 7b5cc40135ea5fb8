// A GGUF model read as the Hugging Face folder it came from: its tokenizer
// (tokenizer.ggml.*) gives the ids of the original Hugging Face tokenizer
// the file was converted from, for each pre-tokenizer and for SentencePiece;
// a run and generation read the model from the GGUF file alone, with logits
// and greedy tokens equal to transformers' GGUF loader
// (tests/peers/gguf_tokenizers.py writes the files with ggml's gguf package);
// a tokenizer tightfit cannot reproduce is refused by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bpe_tokenizer.hpp"
#include "gguf_file.hpp"
#include "gguf_folder.hpp"
#include "gguf_recipe.hpp"
#include "session.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

class GgufTokenizers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    // The converted folders go to a cache of the test's own.
    setenv("TIGHTFIT_CACHE", (dir_->str() + "/cache").c_str(), 1);
    const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                            "/tests/peers/gguf_tokenizers.py " + dir_->str() + " > " + dir_->str() +
                            "/peer.log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0)
        << "the Python peer failed (see its log); scripts/setup installs gguf and transformers";
  }
  static void TearDownTestSuite() { delete dir_; }
  static nlohmann::json read_json(const std::string& name) {
    std::ifstream in(dir_->str() + "/" + name);
    return nlohmann::json::parse(in);
  }
  static std::string path(const std::string& name) { return dir_->str() + "/" + name; }

  void compare_ids(const std::string& name) {
    const gguf::ModelFolder folder = gguf::model_folder(path(name + ".gguf"));
    ASSERT_EQ(folder.tokenizer_error, "") << name;
    auto tok = BpeTokenizer::load(folder.path);
    const auto lines = read_json("lines.json");
    const auto want = read_json(name + ".ids.json");
    size_t mismatches = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string line = lines[i].get<std::string>();
      const auto ids = want["ids"][i].get<std::vector<int64_t>>();
      const std::vector<int64_t> got = tok->encode_with_special_tokens(line);
      if (got != ids && ++mismatches <= 3)
        ADD_FAILURE() << name << " line " << i << ": \"" << line << "\"\n got  "
                      << ::testing::PrintToString(got) << "\n want "
                      << ::testing::PrintToString(ids);
    }
    EXPECT_EQ(mismatches, 0u) << name << ", of " << lines.size() << " lines";
  }

  static test::TempDir* dir_;
};
test::TempDir* GgufTokenizers::dir_ = nullptr;

TEST_F(GgufTokenizers, Gpt2PreTokenizerIdsEqualTheOriginal) {
  compare_ids("gpt2");
}
TEST_F(GgufTokenizers, SmolLMPreTokenizerSplitsDigitsAsTheOriginal) {
  compare_ids("smollm");
}
TEST_F(GgufTokenizers, Llama3PreTokenizerIgnoreMergesAndBosAsTheOriginal) {
  compare_ids("llama3");
}
TEST_F(GgufTokenizers, Qwen2PreTokenizerAndNfcAsTheOriginal) {
  compare_ids("qwen2");
}
TEST_F(GgufTokenizers, SentencePieceIdsEqualLlamaTokenizer) {
  compare_ids("spm");
}

// The folder is written once, whole, into the cache: config.json from the
// metadata, the tokenizer's files, the GGUF it came from; a second read
// finds it and writes nothing.
TEST_F(GgufTokenizers, TheConvertedFolderIsWrittenOnceAndWhole) {
  const gguf::ModelFolder a = gguf::model_folder(path("smollm.gguf"));
  EXPECT_EQ(fs::path(a.path).parent_path(), fs::path(dir_->str()) / "cache" / "gguf");
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json",
                        "generation_config.json", "source.txt", ".complete"})
    EXPECT_TRUE(fs::exists(fs::path(a.path) / f)) << f;
  const auto config = nlohmann::json::parse(std::ifstream(a.path + "/config.json"));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["num_hidden_layers"], 2);
  const auto tc = nlohmann::json::parse(std::ifstream(a.path + "/tokenizer_config.json"));
  EXPECT_EQ(tc["eos_token"], "<|im_end|>");
  EXPECT_EQ(tc["add_bos_token"], false);
  const auto time = fs::last_write_time(fs::path(a.path) / "tokenizer.json");
  const gguf::ModelFolder b = gguf::model_folder(path("smollm.gguf"));
  EXPECT_EQ(b.path, a.path);
  EXPECT_EQ(fs::last_write_time(fs::path(b.path) / "tokenizer.json"), time);
  for (const auto& e : fs::directory_iterator(fs::path(a.path).parent_path()))
    EXPECT_EQ(e.path().string().find(".partial"), std::string::npos) << e.path();
  // Another file, another folder.
  EXPECT_NE(gguf::model_folder(path("gpt2.gguf")).path, a.path);
}

// Each defect in a file's tokenizer is named, with what to do; none is
// replaced by a guess.
TEST_F(GgufTokenizers, ATokenizerTightfitCannotReproduceIsRefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"no_tokenizer", "holds no tokenizer (tokenizer.ggml.model)"},
      {"no_pre", "names no pre-tokenizer (tokenizer.ggml.pre)"},
      {"unknown_pre", "tokenizer.ggml.pre is \"mystery-pre\""},
      {"t5", "tokenizer.ggml.model is \"t5\""},
      {"short_types", "tokenizer.ggml.token_type has 2 entries for 5 tokens"},
      {"bos_out", "tokenizer.ggml.bos_token_id is 99, not a token id"},
      {"bad_merge", "tokenizer.ggml.merges entry 0 is not two tokens"},
      {"spm_bad_type", "of token 3 is 9, not a type"},
  };
  for (const auto& [name, why] : cases) {
    const gguf::ModelFolder f = gguf::model_folder(path(std::string("bad/") + name + ".gguf"));
    EXPECT_NE(f.tokenizer_error.find(why), std::string::npos) << name << ": " << f.tokenizer_error;
    EXPECT_FALSE(fs::exists(fs::path(f.path) / "tokenizer.json")) << name;
  }
  // As a run's tokenizer ("auto"): the same reason, as a recipe error.
  test::TempDir out;
  std::string recipe =
      test::gguf_recipe(test::write_corpus(out), out.str(), path("bad/unknown_pre.gguf"));
  const std::string error = test::recipe_error(recipe);
  EXPECT_NE(error.find("mystery-pre"), std::string::npos) << error;
  // And bytes in place of a GGUF model's own tokenizer are refused.
  recipe.replace(recipe.find("tokenizer = \"auto\""), 18, "tokenizer = \"byte\"");
  const std::string bytes = test::recipe_error(recipe);
  EXPECT_NE(bytes.find("is a GGUF model, which reads the ids of its own tokenizer"),
            std::string::npos)
      << bytes;
}

// [model] config and weights = the GGUF file: the model's shape from its
// metadata, its tensors (F32, F16, Q8_0; q/k permutation undone) as
// transformers' GGUF loader dequantizes them; logits within 1e-4 and
// greedy tokens equal, with and without the cache.
class GgufModels : public GgufTokenizers {
 protected:
  std::unique_ptr<Session> session(const std::string& name) {
    const std::string recipe =
        test::gguf_recipe("builtin:fortunes", out_.str(), path(name + ".gguf"));
    SessionOptions so;
    so.skip_data = true;
    return test::make_session(recipe, so);
  }
  void compare(const std::string& name) {
    const auto want = read_json(name + ".model.json");
    auto s = session(name);
    const auto prompt_ids = want["prompt_ids"].get<std::vector<int64_t>>();
    EXPECT_EQ(s->data().tokenizer().encode_with_special_tokens("The memory budget 2026"),
              prompt_ids)
        << name;
    {
      at::NoGradGuard no_grad;
      const at::Tensor tokens = at::tensor(prompt_ids, at::kLong).unsqueeze(0);
      const at::Tensor logits =
          s->executor().forward_logits(tokens, /*training=*/false, at::Tensor());
      const at::Tensor last = logits[0][-1].to(at::kFloat);
      const at::Tensor ref = at::tensor(want["logits"].get<std::vector<float>>());
      const double err = (last - ref).abs().max().item<double>();
      EXPECT_LE(err, 1e-4) << name;
    }
    const std::string expected =
        s->data().tokenizer().decode(want["new_ids"].get<std::vector<int64_t>>());
    SamplingOptions o;
    o.n_tokens = 12;
    o.top_k = 1;
    o.temperature = 0;
    for (bool cache : {true, false}) {
      o.use_cache = cache;
      EXPECT_EQ(s->generate("The memory budget 2026", o), expected)
          << name << (cache ? " with" : " without") << " the cache";
    }
  }
  test::TempDir out_;
};

TEST_F(GgufModels, Llama3StyleFileLogitsAndGreedyTokensEqualTransformers) {
  compare("llama3");
}
TEST_F(GgufModels, SentencePieceFileLogitsAndGreedyTokensEqualTransformers) {
  compare("spm");
}

// A run trains from the GGUF file and exports a Hugging Face folder whose
// tokenizer is the converted one.
TEST_F(GgufModels, ARunFineTunesFromTheFileAndExportsAFolder) {
  test::TempDir out;
  const std::string recipe =
      test::gguf_recipe(test::write_corpus(out), out.str(), path("smollm.gguf"));
  const std::string file = test::write_file(out, "r.toml", recipe);
  std::string log;
  ASSERT_EQ(test::run_tightfit("run " + file + " --quiet", &log), 0) << log;
  std::string exported;
  ASSERT_EQ(test::run_tightfit("export " + file + " --out " + out.str() + "/hf", &exported), 0)
      << exported;
  for (const char* f :
       {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(out.path() / "hf" / f)) << f << "\n" << exported;
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// The shipped recipe that fine-tunes the real SmolLM2 GGUF (scripts/setup
// fetches it) composes and plans: its paths, the converted folder, LoRA on
// every projection.
TEST(GgufRecipes, TheSmolLM2PersonaRecipePlans) {
  test::TempDir cache;
  setenv("TIGHTFIT_CACHE", cache.str().c_str(), 1);
  const std::string root = TIGHTFIT_SOURCE_DIR;
  ASSERT_TRUE(fs::is_regular_file(root + "/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
      << "run scripts/setup";
  std::string out;
  ASSERT_EQ(test::run_tightfit("plan " + root + "/configs/default.toml", &out), 0) << out;
  EXPECT_NE(out.find("adapters"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(cache.path() / "gguf")) << out;
}

}  // namespace
}  // namespace tightfit
