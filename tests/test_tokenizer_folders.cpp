// A model folder's tokenizer as transformers' AutoTokenizer builds it:
// tokenizer.json, else vocab.json + merges.txt, else a SentencePiece BPE
// tokenizer.model; tokenizer_config.json's class and add_bos_token /
// add_eos_token; special tokens added as the fast tokenizer adds them. The
// ids are transformers' own (tests/peers/tokenizer_folders.py), and a folder
// with nothing tightfit can reproduce is refused by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bpe_tokenizer.hpp"
#include "data_setup.hpp"
#include "generation.hpp"
#include "sentencepiece_model.hpp"
#include "session.hpp"
#include "test_support.hpp"
#include "tokenizer_folder.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

class TokenizerFolders : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                            "/tests/peers/tokenizer_folders.py " + dir_->str() + " > " +
                            dir_->str() + "/peer.log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0)
        << "the Python peer failed (see its log); scripts/setup installs transformers and "
           "sentencepiece";
  }
  static void TearDownTestSuite() { delete dir_; }
  static nlohmann::json read_json(const std::string& name) {
    std::ifstream in(dir_->str() + "/" + name);
    return nlohmann::json::parse(in);
  }
  static std::string folder(const std::string& name) { return dir_->str() + "/" + name; }
  // tokenizer(line)["input_ids"] and the decoded text, line for line.
  void compare(const std::string& name) {
    auto tok = BpeTokenizer::load(folder(name));
    const auto lines = read_json("lines.json");
    const auto want = read_json(name + ".ids.json");
    EXPECT_EQ(tok->vocab_size(), want["vocab_size"].get<int64_t>()) << name;
    size_t mismatches = 0, decode_mismatches = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string line = lines[i].get<std::string>();
      const auto ids = want["ids"][i].get<std::vector<int64_t>>();
      const std::vector<int64_t> got = tok->encode_with_special_tokens(line);
      if (got != ids && ++mismatches <= 3)
        ADD_FAILURE() << name << " line " << i << ": \"" << line << "\"\n got  "
                      << ::testing::PrintToString(got) << "\n want "
                      << ::testing::PrintToString(ids);
      if (tok->decode(ids) != want["decoded"][i].get<std::string>() && ++decode_mismatches <= 3)
        ADD_FAILURE() << name << " decode of line " << i << ": \"" << tok->decode(ids) << "\" vs \""
                      << want["decoded"][i].get<std::string>() << "\"";
    }
    EXPECT_EQ(mismatches, 0u) << name << ", of " << lines.size() << " lines";
    EXPECT_EQ(decode_mismatches, 0u) << name;
  }
  static test::TempDir* dir_;
};
test::TempDir* TokenizerFolders::dir_ = nullptr;

TEST_F(TokenizerFolders, Gpt2VocabAndMergesAsGpt2TokenizerFast) {
  compare("gpt2_vm");
}
TEST_F(TokenizerFolders, Gpt2ClassFromConfigModelType) {
  compare("gpt2_vm_type");
}
TEST_F(TokenizerFolders, Gpt2AddBosTokenAndPrefixSpace) {
  compare("gpt2_vm_bos");
}
TEST_F(TokenizerFolders, Qwen2VocabAndMergesWithAddedTokensDecoder) {
  compare("qwen2_vm");
}
TEST_F(TokenizerFolders, SentencePieceBpeModelAsLlamaTokenizerFast) {
  compare("llama_spm");
}
TEST_F(TokenizerFolders, SentencePieceNonLegacyWithEos) {
  compare("llama_spm_new");
}
TEST_F(TokenizerFolders, LlamaAddBosFalseAddEosTrueRebuildThePostProcessor) {
  compare("llama_json_flags");
}
TEST_F(TokenizerFolders, LlamaClassDefaultsFromModelType) {
  compare("llama_json_type");
}
// Metaspace's "first" prepend beside special and added tokens, leading
// spaces and newlines (the EDGES lines of tokenizer_folders.py).
TEST_F(TokenizerFolders, MetaspaceFirstWithSpecialTokensAsLlamaTokenizerNonLegacy) {
  compare("spm_json_first");
}

TEST_F(TokenizerFolders, UnigramSentencePieceIsRefusedByName) {
  try {
    BpeTokenizer::load(folder("unigram_spm"));
    FAIL() << "a Unigram tokenizer.model was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unigram"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.model"), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerFolders, AFolderWithoutTokenizerIsRefusedNamingItAndTheFix) {
  test::TempDir d;
  fs::create_directories(d.str() + "/model");
  try {
    BpeTokenizer::load(d.str() + "/model");
    FAIL() << "a folder without a tokenizer was read";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(d.str() + "/model"), std::string::npos) << m;
    EXPECT_NE(m.find("tokenizer = \"byte\""), std::string::npos) << m;
  }
}

TEST_F(TokenizerFolders, AnUnknownTokenizerClassIsRefused) {
  test::TempDir d;
  fs::copy(folder("llama_json_type"), d.str() + "/m");
  fs::remove(d.str() + "/m/config.json");
  test::write_file(d, "m/tokenizer_config.json", R"({"tokenizer_class": "T5Tokenizer"})");
  try {
    BpeTokenizer::load(d.str() + "/m");
    FAIL() << "an unknown tokenizer class was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("T5Tokenizer"), std::string::npos) << e.what();
  }
}

// [data] tokenizer: the byte tokenizer only when the recipe names it.
TEST_F(TokenizerFolders, DataSetupNeverFallsBackToBytes) {
  test::TempDir d;
  fs::create_directories(d.str() + "/bare");
  auto refused = [&](DataRequest r, const std::string& needle) {
    r.read_data = false;
    try {
      setup_data(r);
      ADD_FAILURE() << "tokenizer " << r.tokenizer << " with weights \"" << r.weights
                    << "\" was set up";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  DataRequest r;
  r.tokenizer = "auto";
  refused(r, "tokenizer = \"byte\"");  // no weights at all
  r.weights = d.str() + "/bare";
  refused(r, d.str() + "/bare");  // a weights folder without a tokenizer
  r.tokenizer = "byte";
  r.weights = folder("llama_spm");
  refused(r, "tokenizer = \"auto\"");  // bytes for a model with its own tokenizer
  // What it is given: the folder's own tokenizer, or bytes when asked.
  r.tokenizer = "auto";
  r.read_data = false;
  EXPECT_EQ(setup_data(r).tokenizer->vocab_size(), read_json("llama_spm.ids.json")["vocab_size"]);
  r.weights.clear();
  r.tokenizer = "byte";
  EXPECT_EQ(setup_data(r).tokenizer->vocab_size(), 256);
}

// A damaged tokenizer.model is refused naming it, never read past its end.
TEST_F(TokenizerFolders, DamagedSentencePieceModelsAreRefused) {
  std::ifstream in(folder("llama_spm") + "/tokenizer.model", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 100u);
  EXPECT_EQ(SentencePieceModel::parse(bytes, "m").algorithm, SentencePieceModel::Algorithm::kBpe);
  for (size_t cut : {size_t{1}, size_t{7}, bytes.size() / 2, bytes.size() - 1}) {
    try {
      SentencePieceModel::parse(bytes.substr(0, cut), "m");
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("m is not a SentencePiece model"), std::string::npos);
    }
  }
  // A length that claims more than the file holds.
  const std::string huge = std::string("\x0a\xff\xff\xff\xff\x0f", 6) + "abc";
  EXPECT_THROW(SentencePieceModel::parse(huge, "m"), std::invalid_argument);
  EXPECT_THROW(SentencePieceModel::parse(std::string(12, '\xff'), "m"), std::invalid_argument);
  EXPECT_THROW(SentencePieceModel::parse("", "m"), std::invalid_argument);
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// Greedy generation from a plain prompt equals transformers' generate from
// tokenizer(prompt), also with its repetition penalty: the tokenizer's BOS included (a Llama-2
// tokenizer.model, a Llama-3 tokenizer.json with TemplateProcessing, GPT-2 vocab.json +
// merges.txt), with and without the key/value cache, whose context is never
// cropped to seq_len (8 here, under the prompt and its 16 new tokens).
class GenerateFromFolders : public TokenizerFolders {
 protected:
  std::unique_ptr<Session> session(const std::string& name) {
    const std::string plugin = name == "gpt2_vm" ? "gpt2" : "llama";
    std::string recipe = test::tiny_recipe("builtin:fortunes", out_.str());
    const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
    recipe.replace(begin, end - begin,
                   "[model]\nplugin = \"" + plugin + "\"\nconfig = \"" + folder(name) +
                       "\"\nweights = \"" + folder(name) + "\"\n\n");
    recipe.replace(recipe.find("tokenizer = \"byte\""), 18, "tokenizer = \"auto\"");
    recipe.replace(recipe.find("seq_len = 32"), 12, "seq_len = 8");
    SessionOptions so;
    so.skip_data = true;
    return test::make_session(recipe, so);
  }
  void compare(const std::string& name) {
    const auto want = read_json(name + ".generate.json");
    auto s = session(name);
    const std::string prompt = want["prompt"].get<std::string>();
    EXPECT_EQ(s->data().tokenizer().encode_with_special_tokens(prompt),
              want["prompt_ids"].get<std::vector<int64_t>>())
        << name;
    SamplingOptions o;
    o.n_tokens = 16;
    o.top_k = 1;
    o.temperature = 0;
    for (bool cache : {true, false}) {
      o.use_cache = cache;
      EXPECT_EQ(s->generate(prompt, o), want["text"].get<std::string>())
          << name << (cache ? " with" : " without") << " the cache";
    }
    // transformers' repetition penalty over the prompt and the output.
    o.repetition_penalty = want["repetition_penalty"].get<double>();
    for (bool cache : {true, false}) {
      o.use_cache = cache;
      EXPECT_EQ(s->generate(prompt, o), want["penalised_text"].get<std::string>())
          << name << " penalised" << (cache ? " with" : " without") << " the cache";
    }
    o.repetition_penalty = 1.0;
    // Past max_position_embeddings (64): refused with and without the cache.
    o.n_tokens = 80;
    for (bool cache : {true, false}) {
      o.use_cache = cache;
      EXPECT_ANY_THROW(s->generate(prompt, o)) << name << (cache ? " with" : " without");
    }
  }
  test::TempDir out_;
};

TEST_F(GenerateFromFolders, Llama2TokenizerModelGreedyEqualsTransformers) {
  compare("llama_spm");
}
TEST_F(GenerateFromFolders, Llama3TokenizerJsonGreedyEqualsTransformers) {
  compare("llama3");
}
TEST_F(GenerateFromFolders, Gpt2VocabMergesGreedyEqualsTransformers) {
  compare("gpt2_vm");
}
TEST_F(GenerateFromFolders, LlamaTokenizerJsonGreedyEqualsTransformers) {
  compare("llama_json_type");
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

namespace fs = std::filesystem;

// The byte tokenizer as export writes it: transformers' AutoTokenizer and
// tightfit's "auto" read it back to the byte tokenizer's own ids.
TEST(ByteTokenizerExport, TransformersAndTightfitReadItAsBytes) {
  test::TempDir d;
  fs::create_directories(d.path() / "m");
  test::write_file(d, "m/tokenizer.json", byte_tokenizer_json());
  test::write_file(d, "m/tokenizer_config.json", byte_tokenizer_config_json());
  test::write_file(d, "m/config.json", R"({"model_type": "gpt2"})");
  const std::string text = "Hello, caf\xc3\xa9 \xf0\x9f\x99\x82\n\t  <|endoftext|> x";
  test::write_file(d, "text.txt", text);
  const std::string cmd =
      test::peer_python() +
      " -c \"import json,sys; "
      "from transformers import AutoTokenizer; t=AutoTokenizer.from_pretrained(sys.argv[1]); "
      "s=open(sys.argv[2],encoding='utf-8').read(); "
      "json.dump(t(s)['input_ids'], open(sys.argv[3],'w'))\" " +
      d.str() + "/m " + d.str() + "/text.txt " + d.str() + "/ids.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(d.str() + "/ids.json");
  const auto hf = nlohmann::json::parse(in).get<std::vector<int64_t>>();
  const std::vector<int64_t> bytes = ByteTokenizer().encode(text);
  EXPECT_EQ(hf, bytes);
  auto tok = BpeTokenizer::load(d.str() + "/m");
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->encode_with_special_tokens(text), bytes);
  EXPECT_EQ(tok->decode(bytes), text);
}

}  // namespace
}  // namespace tightfit
