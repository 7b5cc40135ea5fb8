// `tightfit export --format gguf`: a LoRA run on a GGUF model exported as a
// merged GGUF model (F32, F16, BF16, Q8_0) and as a llama.cpp LoRA adapter,
// checked against the readers users have (tests/peers/gguf_export.py): the
// gguf package's bytes (each tensor equal to gguf.quants.quantize of the
// exported Hugging Face tensor, q/k permuted), the source's llama.* and
// tokenizer.* metadata carried over, transformers' GGUF loader (logits of
// the F32 file equal to the Hugging Face folder's), the adapter's merge as
// llama.cpp computes it; and tightfit reading each file back (logits within
// 1e-4 of transformers on it, greedy tokens equal).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "bpe_tokenizer.hpp"
#include "gguf_export.hpp"
#include "gguf_recipe.hpp"
#include "gguf_tokenizer.hpp"
#include "model_families.hpp"
#include "session.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

std::string python() {
  return test::peer_python() + " " + TIGHTFIT_SOURCE_DIR + "/tests/peers/";
}

class GgufExport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    setenv("TIGHTFIT_CACHE", (dir_->str() + "/cache").c_str(), 1);
    const std::string d = dir_->str();
    ASSERT_EQ(
        std::system((python() + "gguf_tokenizers.py " + d + " > " + d + "/peer.log 2>&1").c_str()),
        0)
        << "the Python peer failed (see its log); scripts/setup installs gguf and transformers";
    // A LoRA run on the Llama-3-style file (its lr moves B off zero in 4 steps).
    const std::string recipe = test::gguf_recipe(
        test::write_corpus(*dir_), d + "/runs", d + "/llama3.gguf",
        "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8\ntargets = [\"q_proj\", "
        "\"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\"]\n");
    recipe_ =
        new std::string(test::write_file(*dir_, "lora.toml",
                                         recipe.substr(0, recipe.find("lr = 1e-3")) + "lr = 1e-2" +
                                             recipe.substr(recipe.find("lr = 1e-3") + 9)));
    std::string log;
    ASSERT_EQ(test::run_tightfit("run " + *recipe_ + " --quiet", &log), 0) << log;
    const std::string e = d + "/export";
    fs::create_directories(e);
    for (const std::string& args :
         {std::string("--out ") + e + "/hf", "--adapter --out " + e + "/peft",
          "--out " + e + "/m-f32.gguf --outtype f32", "--out " + e + "/m-f16.gguf",
          "--format gguf --out " + e + "/m-bf16.gguf --outtype bf16",
          "--out " + e + "/m-q8_0.gguf --outtype q8_0", "--adapter --out " + e + "/lora.gguf"})
      ASSERT_EQ(test::run_tightfit("export " + *recipe_ + " " + args, &log), 0) << args << "\n"
                                                                                << log;
    ASSERT_EQ(std::system((python() + "gguf_export.py " + d + "/llama3.gguf " + e + " > " + d +
                           "/export.log 2>&1")
                              .c_str()),
              0)
        << "tests/peers/gguf_export.py failed; its log is " << d << "/export.log";
    std::ifstream in(e + "/report.json");
    report_ = new nlohmann::json(nlohmann::json::parse(in));
  }
  static void TearDownTestSuite() {
    delete report_;
    delete recipe_;
    delete dir_;
  }
  static test::TempDir* dir_;
  static std::string* recipe_;
  static nlohmann::json* report_;
};
test::TempDir* GgufExport::dir_ = nullptr;
std::string* GgufExport::recipe_ = nullptr;
nlohmann::json* GgufExport::report_ = nullptr;

TEST_F(GgufExport, EveryTensorIsTheGgufPackagesEncodingOfTheMergedModel) {
  const nlohmann::json& r = *report_;
  for (const char* type : {"f32", "f16", "bf16", "q8_0"}) {
    const auto& t = r["tensors"][type];
    EXPECT_EQ(t["wrong"].size(), 0u) << type << ": " << t["wrong"].dump();
    EXPECT_EQ(t["in_file"], t["checked"]) << type;
  }
  const std::pair<const char*, int> file_types[] = {
      {"f32", 0}, {"f16", 1}, {"bf16", 32}, {"q8_0", 7}};
  for (const auto& [type, id] : file_types) {
    EXPECT_EQ(r["general"][type]["architecture"], "llama") << type;
    EXPECT_EQ(r["general"][type]["type"], "model") << type;
    EXPECT_EQ(r["general"][type]["file_type"], id) << type;
  }
  EXPECT_EQ(r["metadata_wrong"].size(), 0u) << r["metadata_wrong"].dump();
  // transformers reads the F32 file as the very model of the Hugging Face folder.
  EXPECT_LE(r["transformers_f32_vs_hf"].get<double>(), 1e-5);
}

TEST_F(GgufExport, TheAdapterIsWhatLlamaCppMergesIntoTheBase) {
  const nlohmann::json& l = (*report_)["lora"];
  EXPECT_EQ(l["general_type"], "adapter");
  EXPECT_EQ(l["adapter_type"], "lora");
  EXPECT_EQ(l["architecture"], "llama");
  EXPECT_EQ(l["alpha"].get<double>(), 8.0);
  EXPECT_EQ(l["pairs"], 10);  // 5 projections x 2 layers
  EXPECT_EQ(l["in_file"], 20);
  EXPECT_EQ(l["wrong"].size(), 0u) << l["wrong"].dump();
  EXPECT_GT(l["b_abs_max"].get<double>(), 1e-4);  // the run trained the adapter
  // The base GGUF + alpha / r * B A (what llama.cpp computes) is the merged export.
  EXPECT_LE(l["merge_max_err"].get<double>(), 1e-5);
}

// tightfit reads back what it wrote as transformers does.
TEST_F(GgufExport, EachExportedFileRunsInTightfitAsInTransformers) {
  test::TempDir out;
  for (const char* type : {"f32", "f16", "bf16", "q8_0"}) {
    const std::string file = dir_->str() + "/export/m-" + type + ".gguf";
    SessionOptions so;
    so.skip_data = true;
    auto s = test::make_session(test::gguf_recipe("builtin:fortunes", out.str(), file), so);
    const auto& want = (*report_)["logits"][type];
    const auto prompt_ids = want["prompt_ids"].get<std::vector<int64_t>>();
    const std::string prompt = want["prompt"].get<std::string>();
    const auto& tok = s->data().tokenizer();
    EXPECT_EQ(tok.encode_with_special_tokens(prompt), prompt_ids) << type;
    at::NoGradGuard no_grad;
    const at::Tensor tokens = at::tensor(prompt_ids, at::kLong).unsqueeze(0);
    const at::Tensor logits = s->executor().forward_logits(tokens, false, at::Tensor());
    const at::Tensor ref = at::tensor(want["logits"].get<std::vector<float>>());
    EXPECT_LE((logits[0][-1].to(at::kFloat) - ref).abs().max().item<double>(), 1e-4) << type;
    SamplingOptions o;
    o.n_tokens = 8;
    o.top_k = 1;
    o.temperature = 0;
    EXPECT_EQ(s->generate(prompt, o), tok.decode(want["new_ids"].get<std::vector<int64_t>>()))
        << type;
  }
}

// A Hugging Face byte-level BPE tokenizer becomes the keys convert_hf_to_gguf
// writes (tests/peers/gguf_tokenizers.py writes them as it does): the same
// tokens, types, merges and pre-tokenizer name, BOS/EOS and chat template;
// read back as llama.cpp reads them, the ids of the original on every test
// line. A SentencePiece tokenizer.model is refused by name.
TEST_F(GgufExport, AHuggingFaceTokenizerBecomesTheKeysLlamaCppsConverterWrites) {
  const std::string d = dir_->str();
  const std::pair<const char*, const char*> styles[] = {
      {"gpt2", "gpt-2"}, {"smollm", "smollm"}, {"llama3", "llama-bpe"}, {"qwen2", "qwen2"}};
  std::ifstream lines_in(d + "/lines.json");
  const auto lines = nlohmann::json::parse(lines_in);
  for (const auto& [name, pre] : styles) {
    const std::string file = d + "/export/" + name + "-tokenizer.gguf";
    {
      gguf::GgufWriter w(file);
      gguf::write_tokenizer_keys(d + "/" + name + "_hf/tokenizer.json", w);
      w.finish();
    }
    const gguf::GgufReader got(file), want(d + "/" + name + ".gguf");
    EXPECT_EQ(got.get("tokenizer.ggml.pre").s, pre) << name;
    for (const char* key : {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"}) {
      const auto &a = got.get(key).items, &b = want.get(key).items;
      ASSERT_EQ(a.size(), b.size()) << name << " " << key;
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += a[i].s != b[i].s;
      EXPECT_EQ(differ, 0u) << name << " " << key;
    }
    const auto &ta = got.get("tokenizer.ggml.token_type").items,
               &tb = want.get("tokenizer.ggml.token_type").items;
    ASSERT_EQ(ta.size(), tb.size()) << name;
    for (size_t i = 0; i < ta.size(); ++i) EXPECT_EQ(ta[i].i, tb[i].i) << name << " token " << i;
    EXPECT_EQ(got.get("tokenizer.ggml.add_bos_token").b, std::string(name) == "llama3") << name;
    // Read back as llama.cpp reads it: the original's ids, line for line.
    const gguf::TokenizerFiles files = gguf::tokenizer_files(got);
    const std::string folder = d + "/export/" + name + "-tokenizer";
    fs::create_directories(folder);
    std::ofstream(folder + "/tokenizer.json") << files.tokenizer.dump();
    std::ofstream(folder + "/tokenizer_config.json") << files.tokenizer_config.dump();
    const auto tok = BpeTokenizer::load(folder);
    std::ifstream ids_in(d + "/" + name + ".ids.json");
    const auto ids = nlohmann::json::parse(ids_in)["ids"];
    size_t mismatches = 0;
    for (size_t i = 0; i < lines.size(); ++i)
      mismatches += tok->encode_with_special_tokens(lines[i].get<std::string>()) !=
                    ids[i].get<std::vector<int64_t>>();
    EXPECT_EQ(mismatches, 0u) << name << ", of " << lines.size() << " lines";
  }
  // tokenizer_config.json's BOS, EOS and chat template come along.
  const gguf::GgufReader smollm(d + "/export/smollm-tokenizer.gguf");
  const auto& tokens = smollm.get("tokenizer.ggml.tokens").items;
  EXPECT_EQ(tokens[smollm.get("tokenizer.ggml.bos_token_id").i].s, "<|im_start|>");
  EXPECT_EQ(tokens[smollm.get("tokenizer.ggml.eos_token_id").i].s, "<|im_end|>");
  EXPECT_NE(smollm.get("tokenizer.chat_template").s.find("<|im_start|>{{ m.role }}"),
            std::string::npos);
  gguf::GgufWriter w(d + "/export/never.gguf");
  try {
    gguf::write_tokenizer_keys(d + "/spm_folder/tokenizer.model", w);
    ADD_FAILURE() << "a SentencePiece model was written as byte-level keys";
  } catch (const gguf::GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("convert_hf_to_gguf.py"), std::string::npos) << e.what();
  }
}

// What cannot be written is refused before a file appears.
TEST_F(GgufExport, WhatCannotBeWrittenIsRefusedByName) {
  const std::string e = dir_->str() + "/refused";
  fs::create_directories(e);
  std::string log;
  EXPECT_NE(
      test::run_tightfit("export " + *recipe_ + " --out " + e + "/x.gguf --outtype q4_k_m", &log),
      0);
  EXPECT_NE(log.find("f32, f16, bf16 or q8_0"), std::string::npos) << log;
  EXPECT_NE(test::run_tightfit("export " + *recipe_ + " --out " + e + "/x.gguf --unmerged", &log),
            0);
  EXPECT_NE(test::run_tightfit("export " + *recipe_ + " --out " + e + "/hf --outtype f16", &log),
            0);
  EXPECT_NE(log.find("--format gguf"), std::string::npos) << log;
  // A byte-tokenizer run has no GGUF tokenizer to copy.
  test::TempDir bytes;
  const std::string recipe =
      test::write_file(bytes, "b.toml", test::tiny_recipe(test::write_corpus(bytes), bytes.str()));
  ASSERT_EQ(test::run_tightfit("run " + recipe + " --quiet", &log), 0) << log;
  EXPECT_NE(test::run_tightfit("export " + recipe + " --out " + e + "/b.gguf", &log), 0);
  EXPECT_NE(log.find("model_type"), std::string::npos) << log;  // GPT-2 is not written
  EXPECT_TRUE(fs::is_empty(e)) << "a refused export left files behind";
  // The architecture and tokenizer refusals by themselves.
  EXPECT_THROW(gguf::gguf_architecture({{"model_type", "gpt2"}}), gguf::GgufError);
  gguf::GgufWriter w(e + "/never.gguf");
  try {
    gguf::write_tokenizer_keys("", w);
    ADD_FAILURE() << "a byte tokenizer's keys were copied";
  } catch (const gguf::GgufError& err) {
    EXPECT_NE(std::string(err.what()).find("convert_hf_to_gguf.py"), std::string::npos)
        << err.what();
  }
}

// The families table (util/model_families.hpp): each model_type once, with
// a tokenizer class; one that is not written as GGUF is refused by export;
// one that is reads back as a family with its tokenizer, its head size key
// and its experts (Mistral is written as llama, and reads back as llama).
TEST(ModelFamilies, EachTypeOnceAndWhatIsWrittenReadsBackAsItsKind) {
  std::set<std::string> types;
  for (const ModelFamily& f : model_families()) {
    EXPECT_TRUE(types.insert(f.model_type).second) << f.model_type << " has two rows";
    EXPECT_NE(f.tokenizer_class, nullptr) << f.model_type;
    EXPECT_EQ(f.experts != ExpertLayout::kNone, f.expert_count_key != nullptr) << f.model_type;
    if (f.gguf_writes == nullptr) {
      EXPECT_THROW(gguf::gguf_architecture({{"model_type", f.model_type}}), gguf::GgufError);
      continue;
    }
    EXPECT_EQ(gguf::gguf_architecture({{"model_type", f.model_type}}), f.gguf_writes);
    const ModelFamily* back = family_of_gguf(f.gguf_writes, f.experts != ExpertLayout::kNone);
    ASSERT_NE(back, nullptr) << f.model_type << " is written as " << f.gguf_writes;
    EXPECT_STREQ(back->tokenizer_class, f.tokenizer_class) << f.model_type;
    EXPECT_EQ(back->rope_dimension_count, f.rope_dimension_count) << f.model_type;
    EXPECT_EQ(back->experts, f.experts) << f.model_type;
    EXPECT_EQ(back->shared_expert, f.shared_expert) << f.model_type;
  }
  // A llama with experts is Mixtral; an architecture read by none, none.
  EXPECT_STREQ(family_of_gguf("llama", true)->model_type, "mixtral");
  EXPECT_STREQ(family_of_gguf("llama", false)->model_type, "llama");
  EXPECT_STREQ(family_of_gguf("qwen2moe", false)->model_type, "qwen2_moe");
  EXPECT_EQ(family_of_gguf("gpt2", false), nullptr);
}

}  // namespace
}  // namespace tightfit
