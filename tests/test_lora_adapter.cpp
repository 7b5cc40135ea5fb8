// LoRA adapters on their own, in PEFT's format: PEFT loads what tightfit
// wrote onto the unmerged base and computes the same logits; a run starts
// from an adapter folder where the writing run stopped; mismatches are clear
// errors; the command line and [save] adapter write the folder.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "file_util.hpp"
#include "safetensors.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

namespace fs = std::filesystem;

struct Case {
  const char* name;
  std::string model_table;
  std::string targets;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

const char* kLlamaTable =
    "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\nn_kv_head = 2\n"
    "intermediate_size = 80\nmax_positions = 64\n";

std::string lora_recipe(const test::TempDir& dir, const std::string& model_table,
                        const std::string& lora_keys, const std::string& extra = "") {
  std::string recipe = test::tiny_recipe(
      test::write_corpus(dir), dir.str(), "",
      "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8.0\n" + lora_keys + extra);
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin, "[model]\n" + model_table + "\n");
  return recipe;
}

at::Tensor logits_of(Session& s, const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  return s.executor().forward_logits(tokens, false);
}

class PeftAdapter : public ::testing::TestWithParam<Case> {};

// A LoRA session of the case's model after some training, with its base
// (unmerged) and its adapter written under `out`.
std::unique_ptr<Session> trained_and_exported(const test::TempDir& dir, const std::string& out) {
  const Case& c = PeftAdapter::GetParam();
  auto s = test::make_session(lora_recipe(dir, c.model_table, c.targets));
  s->update().optimizer().set_lr(1e-2);
  s->train();
  s->export_hf(out + "/base", /*merge=*/false);
  s->export_adapter(out + "/adapter");
  return s;
}

TEST_P(PeftAdapter, PeftLoadsItOntoTheUnmergedBase) {
  test::TempDir dir;
  const std::string out = dir.str() + "/peft";
  auto s = trained_and_exported(dir, out);
  ASSERT_TRUE(fs::exists(out + "/adapter/adapter_model.safetensors"));
  ASSERT_TRUE(fs::exists(out + "/adapter/adapter_config.json"));
  const at::Tensor tokens = at::randint(0, 256, {2, 24}, at::kLong);
  write_safetensors(out + "/expected.safetensors",
                    {{"tokens", tokens}, {"logits", logits_of(*s, tokens)}});
  const std::string cmd =
      test::peer_python() + " " + TIGHTFIT_SOURCE_DIR + "/tests/peers/peft_adapter.py " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "PEFT did not reproduce tightfit's logits from " << out;
}

TEST_P(PeftAdapter, ARunStartsFromTheAdapterWhereTheWriterStopped) {
  const Case& c = GetParam();
  test::TempDir dir;
  auto s = trained_and_exported(dir, dir.str());
  const at::Tensor tokens = at::randint(0, 256, {2, 24}, at::kLong);
  const at::Tensor expected = logits_of(*s, tokens);

  test::TempDir dir2;
  auto t =
      test::make_session(lora_recipe(dir2, c.model_table + "weights = \"" + dir.str() + "/base\"\n",
                                     c.targets + "adapter = \"" + dir.str() + "/adapter\"\n"));
  const at::Tensor got = logits_of(*t, tokens);
  EXPECT_LE((got - expected).abs().max().item<double>(), 1e-5);
  // Without the adapter the same base gives other logits: the adapter was applied.
  test::TempDir dir3;
  auto u = test::make_session(
      lora_recipe(dir3, c.model_table + "weights = \"" + dir.str() + "/base\"\n", c.targets));
  EXPECT_GT((logits_of(*u, tokens) - expected).abs().max().item<double>(), 1e-3);
  // Its adapter names the base folder, so PEFT's AutoPeftModelForCausalLM finds it.
  const std::string adapter = u->export_adapter(dir3.str() + "/adapter");
  const auto config = nlohmann::json::parse(read_file_text(adapter + "/adapter_config.json"));
  EXPECT_EQ(config["base_model_name_or_path"],
            std::filesystem::absolute(dir.path() / "base").lexically_normal().string());
  if (std::string(c.name) == "llama") {
    const std::string cmd = test::peer_python() +
                            " -c \"import sys; from peft import "
                            "AutoPeftModelForCausalLM as A; m = A.from_pretrained(sys.argv[1]); "
                            "sys.exit(0 if sum('lora_A' in n for n, _ in m.named_parameters()) "
                            "else 1)\" " +
                            adapter;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << "AutoPeftModelForCausalLM could not load " << adapter;
  }
  // A model from the recipe's init has no base folder to name.
  const auto own = nlohmann::json::parse(
      read_file_text(s->export_adapter(dir3.str() + "/own") + "/adapter_config.json"));
  EXPECT_TRUE(own["base_model_name_or_path"].is_null());
}

INSTANTIATE_TEST_SUITE_P(
    Models, PeftAdapter,
    ::testing::Values(
        // GPT-2's Conv1D layout (fan_in_fan_out); attn.c_proj and mlp.c_proj share a leaf name: a
        // regex.
        Case{"gpt2",
             "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = "
             "2\nn_positions = 64\n",
             "targets = [\"q\", \"o\", \"up\"]\n"},
        // Leaf names pick exactly the adapted modules: a list, as PEFT writes it.
        Case{"llama", kLlamaTable, "targets = [\"q\", \"v\", \"down\"]\n"},
        // Qwen2 (the field notes' model): adapters on the seven projections, q/k/v with biases.
        Case{"qwen2",
             "plugin = \"llama\"\npreset = \"qwen2-1.5B\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
             "n_kv_head = 2\nintermediate_size = 80\nmax_positions = 64\nvocab_size = 256\n",
             "targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n"},
        // Gemma (a small config.json): (1 + w) norms, scaled embeddings, tied head.
        Case{"gemma", test::fixture_model("gemma-tiny"),
             "targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n"},
        // Gemma 2: capped scores and logits, sandwich norms, a sliding layer.
        Case{"gemma2", test::fixture_model("gemma2-tiny"),
             "targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n"},
        // Gemma 3: q/k norms, local and global rotary bases.
        Case{"gemma3_text", test::fixture_model("gemma3-tiny"),
             "targets = [\"q\", \"k\", \"v\", \"o\", \"gate\", \"up\", \"down\"]\n"},
        // Phi-3: q, k and v in one projection, gate and up in one (PEFT targets qkv_proj and
        // gate_up_proj).
        Case{"phi3", test::fixture_model("phi3-tiny"),
             "targets = [\"q\", \"o\", \"gate\", \"down\"]\n"},
        // Mixtral: "gate", "up" and "down" adapt every expert's w1, w3 and w2 (PEFT's names).
        Case{"mixtral", test::fixture_model("mixtral-tiny"),
             "targets = [\"q\", \"gate\", \"up\", \"down\"]\n"},
        // Qwen2-MoE: the routed experts, the shared expert and layer 1's dense MLP share the
        // leaf names gate_proj, up_proj and down_proj; the routers are not adapted.
        Case{"qwen2_moe", test::fixture_model("qwen2-moe-tiny"),
             "targets = [\"v\", \"gate\", \"up\", \"down\"]\n"},
        // RWKV starts with zero output projections, so "o" is adapted for gradients to reach k and
        // v.
        Case{"rwkv", "plugin = \"rwkv\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\n",
             "targets = [\"k\", \"v\", \"o\"]\n"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

std::string error_of(const std::string& recipe) {
  try {
    test::make_session(recipe);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(PeftAdapterErrors, MismatchesNameTheFileAndTheFix) {
  test::TempDir dir;
  auto s = test::make_session(lora_recipe(dir, kLlamaTable, "targets = [\"q\", \"v\"]\n"));
  s->export_adapter(dir.str() + "/adapter");
  const std::string adapter = "adapter = \"" + dir.str() + "/adapter\"\n";

  test::TempDir d1;
  std::string recipe = lora_recipe(d1, kLlamaTable, "targets = [\"q\", \"v\"]\n" + adapter);
  recipe.replace(recipe.find("rank = 4"), 8, "rank = 8");
  EXPECT_NE(error_of(recipe).find("set rank = 4 and alpha = 8"), std::string::npos)
      << error_of(recipe);

  test::TempDir d2;
  const std::string other =
      error_of(lora_recipe(d2, kLlamaTable, "targets = [\"q\", \"down\"]\n" + adapter));
  EXPECT_NE(other.find("mlp.down_proj.lora_A.weight"), std::string::npos) << other;
  EXPECT_NE(other.find("set targets to match"), std::string::npos) << other;

  test::TempDir d3;
  const std::string missing = error_of(
      lora_recipe(d3, kLlamaTable, "targets = [\"q\"]\nadapter = \"" + d3.str() + "/nowhere\"\n"));
  EXPECT_NE(
      missing.find("cannot open PEFT adapter config " + d3.str() + "/nowhere/adapter_config.json"),
      std::string::npos)
      << missing;

  // A broken tensor file is refused by the kernel's validating reader.
  test::TempDir d4;
  fs::create_directories(d4.str() + "/broken");
  test::write_file(d4, "broken/adapter_config.json",
                   read_file_text(dir.str() + "/adapter/adapter_config.json"));
  const char bytes[] = "\x10\0\0\0\0\0\0\0{not json}      ";
  test::write_file(d4, "broken/adapter_model.safetensors", std::string(bytes, sizeof bytes - 1));
  const std::string broken = error_of(lora_recipe(
      d4, kLlamaTable, "targets = [\"q\", \"v\"]\nadapter = \"" + d4.str() + "/broken\"\n"));
  EXPECT_NE(broken.find("adapter_model.safetensors"), std::string::npos) << broken;
}

TEST(PeftAdapterCli, ExportWritesTheAdapterAndSaveAdapterTooWithoutLoraItIsAnError) {
  test::TempDir dir;
  const std::string recipe = test::write_file(
      dir, "r.toml",
      lora_recipe(dir, kLlamaTable, "targets = [\"q\", \"v\"]\n", "[save]\nadapter = true\n"));
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " -q", &out), 0) << out;
  EXPECT_TRUE(fs::exists(dir.str() + "/t/adapter/adapter_config.json")) << out;
  ASSERT_EQ(test::run_tightfit("export " + recipe + " --adapter --out " + dir.str() + "/a", &out),
            0)
      << out;
  EXPECT_TRUE(fs::exists(dir.str() + "/a/adapter_model.safetensors"));

  test::TempDir plain;
  const std::string no_lora =
      test::write_file(plain, "r.toml", test::tiny_recipe(test::write_corpus(plain), plain.str()));
  ASSERT_EQ(test::run_tightfit("run " + no_lora + " -q", &out), 0) << out;
  EXPECT_NE(
      test::run_tightfit("export " + no_lora + " --adapter --out " + plain.str() + "/a", &out), 0);
  EXPECT_NE(out.find("no strategy of this recipe has adapters"), std::string::npos) << out;
}

}  // namespace
}  // namespace tightfit
