// `tightfit export --format gguf` of the mixtures of experts llama.cpp runs
// as qwen2moe, qwen3moe, olmoe and (Mixtral) llama: each layer's routed
// experts stacked into one
// tensor per projection, the routers and Qwen2-MoE's shared expert under
// llama.cpp's names, the expert keys in the metadata — checked against the
// readers users have (tests/peers/gguf_moe.py): every tensor's bytes equal
// gguf.quants.quantize of the transformers tensor stacked as
// convert_hf_to_gguf stacks it (F32 and Q8_0), every name one of gguf's
// tensors for the architecture, and the F32 file's model computing the
// model's logits (transformers' GGUF loader for Qwen-MoE; for Mixtral and
// OLMoE, which it does not read, transformers with the tensors gguf-py
// dequantizes from the file). tightfit reads each file back (each expert
// sliced out of its stack, or a Mixtral file's one tensor per expert) with
// those logits, and QLoRA keeps each expert's own blocks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "gguf_export.hpp"
#include "gguf_recipe.hpp"
#include "session.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

const char* const kFamilies[] = {"qwen2_moe", "qwen3_moe", "mixtral", "olmoe"};

// The GGUF architecture llama.cpp names each family by.
std::string arch_of(const std::string& family) {
  if (family == "mixtral") return "llama";
  if (family == "olmoe") return "olmoe";
  return family == "qwen2_moe" ? "qwen2moe" : "qwen3moe";
}

std::string peer() {
  return test::peer_python() + " " + TIGHTFIT_SOURCE_DIR + "/tests/peers/gguf_moe.py";
}

// The recipe of the model in `folder` (its config, weights and tokenizer).
std::string recipe_of(const test::TempDir& dir, const std::string& folder) {
  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str() + "/runs");
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin,
                 "[model]\nplugin = \"llama\"\nconfig = \"" + folder + "\"\nweights = \"" + folder +
                     "/model.safetensors\"\n\n");
  const auto tok = recipe.find("tokenizer = \"byte\"");
  recipe.replace(tok, 18, "tokenizer = \"" + folder + "/tokenizer.json\"");
  return recipe;
}

class GgufExportMoe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string d = dir_->str();
    ASSERT_EQ(std::system((peer() + " make " + d + " > " + d + "/make.log 2>&1").c_str()), 0)
        << "tests/peers/gguf_moe.py make failed; its log is " << d << "/make.log";
    for (const char* family : kFamilies) {
      const std::string folder = d + "/" + family;
      SessionOptions so;
      so.skip_data = true;
      auto s = test::make_session(recipe_of(*dir_, folder), so);
      s->export_gguf(folder + "/m-f32.gguf", "f32");
      s->export_gguf(folder + "/m-q8_0.gguf", "q8_0");
    }
    ASSERT_EQ(std::system((peer() + " check " + d + " > " + d + "/check.log 2>&1").c_str()), 0)
        << "tests/peers/gguf_moe.py check failed; its log is " << d << "/check.log";
    std::ifstream in(d + "/report.json");
    report_ = new nlohmann::json(nlohmann::json::parse(in));
  }
  static void TearDownTestSuite() {
    delete report_;
    delete dir_;
  }
  static test::TempDir* dir_;
  static nlohmann::json* report_;
};
test::TempDir* GgufExportMoe::dir_ = nullptr;
nlohmann::json* GgufExportMoe::report_ = nullptr;

TEST_F(GgufExportMoe, EveryTensorIsWhatConvertHfToGgufWrites) {
  for (const char* family : kFamilies) {
    SCOPED_TRACE(family);
    const nlohmann::json& r = (*report_)[family];
    EXPECT_EQ(r["arch"], arch_of(family));
    EXPECT_TRUE(r["unknown_names"].empty()) << r["unknown_names"].dump();
    EXPECT_TRUE(r["missing"].empty()) << r["missing"].dump();
    EXPECT_TRUE(r["metadata_wrong"].empty()) << r["metadata_wrong"].dump();
    for (const char* type : {"f32", "q8_0"})
      EXPECT_TRUE(r["wrong"][type].empty()) << type << ": " << r["wrong"][type].dump();
  }
}

TEST_F(GgufExportMoe, TransformersReadsTheModelsLogitsFromTheFile) {
  for (const char* family : kFamilies) {
    const double err = (*report_)[family]["logits_max_err"].get<double>();
    EXPECT_LE(err, 1e-4) << family;
    ::testing::Test::RecordProperty(std::string("max_logit_error_") + family, c10::str(err));
  }
}

// tightfit reads each file back (its experts sliced out of their stacks,
// the expert keys read as llama.cpp reads them) with the logits the file's
// model computes; a Mixtral file with one tensor per expert (as llama.cpp
// wrote them before it stacked experts) gives the F32 file's logits.
TEST_F(GgufExportMoe, TightfitRunsEachFileAsTransformersDoes) {
  test::TempDir out;
  auto logits_of = [&](const std::string& file, const nlohmann::json& ids) {
    SessionOptions so;
    so.skip_data = true;
    auto s = test::make_session(test::gguf_recipe("builtin:fortunes", out.str(), file), so);
    at::NoGradGuard no_grad;
    const at::Tensor t = at::tensor(ids.get<std::vector<int64_t>>(), at::kLong);
    return s->executor().forward_logits(t.unsqueeze(0), false, at::Tensor())[0].to(at::kFloat);
  };
  for (const char* family : kFamilies) {
    for (const char* type : {"f32", "q8_0", "single"}) {
      if (std::string(type) == "single" && std::string(family) != "mixtral") continue;
      SCOPED_TRACE(std::string(family) + " " + type);
      const nlohmann::json& r = (*report_)[family];
      const std::string file = dir_->str() + "/" + family + "/m-" + type + ".gguf";
      const at::Tensor logits = logits_of(file, r["ids"]);
      const char* reference = std::string(type) == "single" ? "f32" : type;
      const at::Tensor want =
          at::tensor(r["logits"][reference].get<std::vector<float>>()).view(logits.sizes());
      const double err = (logits - want).abs().max().item<double>();
      EXPECT_LE(err, 1e-4);
      ::testing::Test::RecordProperty(std::string("tightfit_err_") + family + "_" + type,
                                      c10::str(err));
    }
  }
}

// QLoRA on the Q8_0 file's own blocks (quantize format = "gguf"): each
// routed expert keeps its share of its layer's stack, byte for byte, and
// decodes to what the dense load holds; three steps of LoRA on the
// attention give the dense load's losses exactly.
TEST_F(GgufExportMoe, QloraKeepsEachExpertsBlocksAndTrainsAsTheDenseLoad) {
  test::TempDir out;
  for (const char* family : kFamilies) {
    SCOPED_TRACE(family);
    const std::string file = dir_->str() + "/" + family + "/m-q8_0.gguf";
    const std::string lora =
        "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8\ntargets = [\"q\", \"k\", "
        "\"v\", \"o\"]\n";
    auto plain = test::make_session(test::gguf_recipe("builtin:fortunes", out.str(), file, lora));
    auto kept = test::make_session(
        test::gguf_recipe("builtin:fortunes", out.str(), file,
                          lora + "[[strategy]]\nplugin = \"quantize\"\nformat = \"gguf\"\n"));
    int64_t experts = 0;
    for (const Param& p : kept->store().all()) {
      if (p.name.find(".experts.") == std::string::npos) continue;
      ++experts;
      EXPECT_EQ(p.format, TF_FORMAT_GGML) << p.name;
      EXPECT_TRUE(
          at::equal(kept->executor().fetch_weight(p.name), plain->store().get(p.name).value))
          << p.name << " does not decode to the dense load's values";
    }
    EXPECT_EQ(experts, 2 * 4 * 3);  // layers x experts x projections
    test::expect_the_same_steps(*plain, *kept);
  }
}

// A config llama.cpp's graph would compute differently is refused by name,
// and nothing is left behind; a family tightfit does not write as GGUF is
// refused by its model_type.
TEST_F(GgufExportMoe, WhatLlamaCppWouldComputeDifferentlyIsRefusedByName) {
  auto config_of = [&](const std::string& family) {
    std::ifstream in(dir_->str() + "/" + family + "/config.json");
    return nlohmann::json::parse(in);
  };
  const std::string folder = dir_->str() + "/qwen3_moe";
  const nlohmann::json config = config_of("qwen3_moe");
  const std::string out = dir_->str() + "/refused";
  fs::create_directories(out);
  const std::tuple<const char*, nlohmann::json, const char*> bad[] = {
      {"qwen3_moe", {{"norm_topk_prob", false}}, "norm_topk_prob"},
      {"qwen3_moe", {{"mlp_only_layers", {0}}}, "mlp_only_layers"},
      {"qwen3_moe", {{"decoder_sparse_step", 2}}, "decoder_sparse_step"},
      {"qwen3_moe", {{"model_type", "phimoe"}}, "model_type \"phimoe\""},
      {"mixtral", {{"sliding_window", 4096}}, "sliding_window 4096"},
      {"mixtral", {{"num_local_experts", nullptr}}, "num_local_experts"},
      {"olmoe", {{"norm_topk_prob", true}}, "norm_topk_prob"},
      {"olmoe", {{"clip_qkv", 8.0}}, "clip_qkv"},
      {"olmoe", {{"num_key_value_heads", 2}}, "num_key_value_heads 2"},
  };
  for (const auto& [family, change, named] : bad) {
    nlohmann::json c = config_of(family);
    c.update(change);
    try {
      gguf::GgufModelWriter w(out + "/x.gguf", c, gguf::out_type("f32"), folder + "/tokenizer.json",
                              "x");
      ADD_FAILURE() << family << " " << change.dump() << " was written";
    } catch (const gguf::GgufError& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  }
  // Experts some of which never arrive: no file.
  {
    gguf::GgufModelWriter w(out + "/x.gguf", config, gguf::out_type("f32"),
                            folder + "/tokenizer.json", "x");
    w.add("model.layers.0.mlp.experts.0.up_proj.weight", at::zeros({32, 64}));
    try {
      w.finish();
      ADD_FAILURE() << "a stack of 1 of 4 experts was written";
    } catch (const gguf::GgufError& e) {
      EXPECT_NE(std::string(e.what()).find("blk.0.ffn_up_exps.weight misses 3 of its 4 experts"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(fs::is_empty(out)) << "a refused export left files behind";
}

}  // namespace
}  // namespace tightfit
