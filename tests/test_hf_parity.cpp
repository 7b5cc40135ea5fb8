// Models against Hugging Face transformers on the same random weights:
// logits (1e-4 absolute), loss (1e-5) and every parameter's gradient (1e-4
// relative) after one backward.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "hf_weights.hpp"
#include "memory_accounting.hpp"
#include "safetensors.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

struct Family {
  const char* name;
  std::string model_table;  // replaces the tiny recipe's GPT-2 model keys
  int expected_params;
};

// The peer's model and tightfit's on the same weights and batch. `mode`
// "packed": rows of several examples, with the peer's position_ids; "aux":
// the routers' load-balancing loss over rows with padding (its
// attention_mask). `strategies`: [[strategy]] tables for tightfit's side.
void expect_parity(const Family& f, const std::string& mode, const std::string& strategies = "") {
  test::TempDir dir;
  const std::string python = test::peer_python();
  const std::string script = std::string(TIGHTFIT_SOURCE_DIR) + "/tests/peers/hf_parity.py";
  ASSERT_EQ(
      std::system((python + " " + script + " " + f.name + " " + dir.str() + " " + mode).c_str()), 0)
      << "the Python peer failed; scripts/setup installs torch and transformers into .venv";
  const SafetensorsFile ref = read_safetensors(dir.str() + "/reference.safetensors");

  std::string table = f.model_table;
  if (const auto at = table.find("@DIR@"); at != std::string::npos) table.replace(at, 5, dir.str());
  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str());
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin,
                 "[model]\n" + table + "weights = \"" + dir.str() + "/model.safetensors\"\n\n");
  auto s = test::make_session(recipe + strategies);
  const at::Tensor tokens = ref.tensors.at("tokens"), targets = ref.tensors.at("targets");
  const PassRows rows(mode == "packed" ? ref.tensors.at("positions") : at::Tensor(),
                      mode == "aux" ? ref.tensors.at("attention_mask") : at::Tensor());
  const double loss = ref.tensors.at("loss").item<double>();
  {
    at::NoGradGuard no_grad;
    const at::Tensor logits = s->executor().forward_logits(tokens, /*training=*/false, rows);
    at::Tensor diff = (logits - ref.tensors.at("logits")).abs();
    // Padding's own logits differ (the peer masks it as keys too); no
    // target reads them.
    if (rows.attention_mask.defined()) diff = diff * rows.attention_mask.unsqueeze(-1);
    const double err = diff.max().item<double>();
    EXPECT_LE(err, 1e-4);
    ::testing::Test::RecordProperty("max_logit_error", c10::str(err));
    if (mode == "aux") {  // an evaluation's loss has the term too
      EXPECT_NEAR(s->executor().forward_loss(tokens, targets, false, rows).item<double>(), loss,
                  1e-5);
      // A preference schedule's pass, whose loss the schedule computes,
      // refuses the term by name rather than leave it out.
      try {
        s->executor().token_logps(tokens, targets, {}, {});
        ADD_FAILURE() << "token_logps took a pass with a load-balancing term";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("output_router_logits = false"), std::string::npos)
            << e.what();
      }
      // A batch from a schedule too old to carry the mask: refused, not
      // counted with its padding.
      PassRows unknown = rows;
      unknown.padding_known = false;
      try {
        s->executor().run_pass(tokens, targets, false, 1.0, unknown);
        ADD_FAILURE() << "a batch without its padding took the load-balancing term";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("ABI before 1.16"), std::string::npos) << e.what();
      }
    }
  }
  const PassResult r = s->executor().run_pass(tokens, targets, true, 1.0, rows);
  EXPECT_NEAR(r.loss, loss, 1e-5);
  int compared = 0;
  double worst = 0;
  for (const Param& p : s->store().all()) {
    at::Tensor expected = ref.tensors.at("grad." + p.name);
    if (p.flags & TF_PARAM_HF_TRANSPOSED) expected = expected.t();
    const at::Tensor& g = p.value.grad();
    ASSERT_TRUE(g.defined()) << p.name;
    EXPECT_FALSE(g.is_sparse()) << p.name;  // tied lookups add sparse rows into the head's
    const double rel =
        (g - expected).abs().max().item<double>() / (expected.abs().max().item<double>() + 1e-12);
    EXPECT_LE(rel, 1e-4) << p.name;
    worst = std::max(worst, rel);
    ++compared;
  }
  ::testing::Test::RecordProperty("max_grad_rel_error", c10::str(worst));
  EXPECT_EQ(compared, f.expected_params);
}

class HfParity : public ::testing::TestWithParam<Family> {};

TEST_P(HfParity, MatchesTransformersLogitsLossAndGradients) {
  expect_parity(GetParam(), "");
}

// Rows packed with examples of 7, 6 and 3 tokens (and 10 and 6): positions
// restart and attention stays inside each example, as transformers computes
// them from position_ids (TRL's padding-free packing).
class HfPackedParity : public ::testing::TestWithParam<Family> {};

TEST_P(HfPackedParity, PackedRowsMatchTransformersWithPositionIds) {
  expect_parity(GetParam(), "packed");
}

// output_router_logits: the loss adds router_aux_loss_coef (0.05) times the
// routers' load-balancing loss, over rows whose padding (3 tokens) it leaves
// out as transformers does with attention_mask.
class HfRouterBalanceParity : public ::testing::TestWithParam<Family> {};

TEST_P(HfRouterBalanceParity, LoadBalancingLossMatchesTransformersOverPaddedRows) {
  expect_parity(GetParam(), "aux");
}

// Every block recomputed in backward: each adds its part of the term there.
TEST_P(HfRouterBalanceParity, CheckpointedBlocksGetTheSameGradients) {
  expect_parity(GetParam(), "aux", "[[strategy]]\nplugin = \"checkpoint\"\nevery = 1\n");
}

const std::vector<Family>& families() {
  static const std::vector<Family> all = {
      Family{"gpt2",
             "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 2\nn_embd = "
             "32\nn_head = 2\nn_positions = 64\n",
             2 * 12 + 4},
      // Grouped-query attention: 4 query heads share 2 key/value heads.
      Family{"llama", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 9 + 3},
      // Llama 3 rotary scaling, one key/value head for four queries, tied head.
      Family{"llama3", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 9 + 2},
      // n_inner, exact gelu and layer_norm_epsilon from the config.
      Family{"gpt2_inner", "plugin = \"gpt2\"\nconfig = \"@DIR@\"\n", 2 * 12 + 4},
      // head_dim 12 (hidden 32, 4 heads), q/k/v/o and MLP biases, YaRN, gelu.
      Family{"llama_bias", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 16 + 3},
      // A sliding window of 5 over 16 tokens, dynamic NTK within the context.
      Family{"mistral", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 9 + 3},
      // q/k/v biases, untied head, linear rotary scaling.
      Family{"qwen2", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 12 + 3},
      // use_sliding_window: the second layer sees 6 keys, the first all.
      Family{"qwen2_window", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 12 + 2},
      // Per-head q/k RMSNorm, head_dim 16 != 32 / 4, tied head.
      Family{"qwen3", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 11 + 2},
      // sqrt(C)-scaled embeddings, (1 + w) norms in fp32, GeGLU, head_dim 16, tied, pad_token_id
      // 0 (its row has no lookup gradient, as nn.Embedding's padding_idx).
      Family{"gemma", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 9 + 2},
      // Gemma 2: capped attention scores and logits, query_pre_attn_scalar, pre- and post-norms
      // around each sub-layer (11 weights a layer), layer 0 sliding over 5 keys, layer 1 full.
      Family{"gemma2", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 11 + 2},
      // Gemma 3: Gemma 2's norms (no attention cap) and (1 + w) q/k norms per head; layer 0
      // slides over 5 keys rotating by its own base, layer 1 by rope_theta, linearly scaled.
      Family{"gemma3_text", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 13 + 2},
      // Phi-3: fused qkv_proj and gate_up_proj, half of each head rotated, LongRoPE's long
      // factors (16 tokens past the original 8), every layer sliding over 5 keys.
      Family{"phi3", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 6 + 3},
      // The same within the original context: the short factors.
      Family{"phi3_short", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 6 + 3},
      // Mixtures of 4 experts, 2 per token (tests/peers/hf_parity.py says what each adds):
      // Mixtral's w1/w2/w3 experts, renormalized top 2, every layer sliding over 5 keys.
      Family{"mixtral", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 19 + 3},
      // q/k/v biases, the shared expert and its gate in layer 0; layer 1 dense.
      Family{"qwen2_moe", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 26 + 12 + 3},
      // Per-head q/k norms; layer 0 dense, layer 1 experts (decoder_sparse_step 2).
      Family{"qwen3_moe", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 11 + 21 + 3},
      // q/k norms over all heads, q/k/v clamped.
      Family{"olmoe", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 21 + 3},
      // WKV in chunks of 5 over 16 tokens: the carried state is exercised.
      Family{"rwkv", "plugin = \"rwkv\"\nconfig = \"@DIR@\"\nwkv_chunk = 5\n", 2 * 18 + 2 + 4}};
  return all;
}

// The families whose packed rows are compared (every model but RWKV's
// recurrence reads positions); the names say what each exercises above.
// transformers 4.57's eager attention for olmoe and qwen2_moe ignores
// position_ids when it masks (their old _update_causal_mask): only its
// flash-attention path keeps packed examples apart, as tightfit does, so
// those two have no CPU reference for packed rows.
std::vector<Family> packed_families() {
  std::vector<Family> out;
  for (const Family& f : families())
    for (const char* name : {"gpt2", "llama", "mistral", "qwen2_window", "qwen3", "gemma", "gemma2",
                             "gemma3_text", "phi3", "mixtral", "qwen3_moe"})
      if (std::string(f.name) == name) out.push_back(f);
  return out;
}

std::string family_name(const ::testing::TestParamInfo<Family>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Families, HfParity, ::testing::ValuesIn(families()), family_name);
// Learned positions looked up per example (gpt2); the window of 5 inside
// examples of 7 and 10 tokens (mistral).
INSTANTIATE_TEST_SUITE_P(Families, HfPackedParity, ::testing::ValuesIn(packed_families()),
                         family_name);

std::vector<Family> expert_families() {
  std::vector<Family> out;
  for (const Family& f : families())
    for (const char* name : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"})
      if (std::string(f.name) == name) out.push_back(f);
  return out;
}
INSTANTIATE_TEST_SUITE_P(Families, HfRouterBalanceParity, ::testing::ValuesIn(expert_families()),
                         family_name);

// Block 0 recomputed and block 1 not: the last stage's term carries block 1's
// gradient and block 0's recompute its own.
TEST(HfRouterBalance, SomeBlocksCheckpointedGetTheSameGradients) {
  expect_parity(expert_families().front(), "aux",
                "[[strategy]]\nplugin = \"checkpoint\"\nevery = 2\n");
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// transformers loads the folder `out` and computes the session's logits on
// random tokens (tests/peers/hf_roundtrip.py); returns the tokens and logits.
std::pair<at::Tensor, at::Tensor> expect_transformers_reproduces(Session& s,
                                                                 const std::string& out) {
  const at::Tensor tokens = at::randint(0, 256, {2, 24}, at::kLong);
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = s.executor().forward_logits(tokens, false);
  }
  write_safetensors(out + "/expected.safetensors", {{"tokens", tokens}, {"logits", logits}});
  const std::string cmd =
      test::peer_python() + " " + TIGHTFIT_SOURCE_DIR + "/tests/peers/hf_roundtrip.py " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0)
      << "transformers did not reproduce tightfit's logits from " << out;
  return {tokens, logits};
}

// tightfit trains a few steps, exports a Hugging Face folder, and transformers
// loads it and computes the same logits.
class HfRoundTrip : public ::testing::TestWithParam<Family> {};

TEST_P(HfRoundTrip, TransformersLoadsWhatTightfitSaved) {
  const Family& f = GetParam();
  test::TempDir dir;
  std::string table = f.model_table;
  if (const auto at = table.find("@PEER@"); at != std::string::npos) {
    // The peer's config.json (a Qwen2, Qwen3, Mistral ...), trained from tightfit's own init.
    const std::string peer = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                             "/tests/peers/hf_parity.py " + f.name + " " + dir.str();
    ASSERT_EQ(std::system(peer.c_str()), 0);
    table.replace(at, 6, "config = \"" + dir.str() + "\"\n");
  } else if (const auto at = table.find("config = \"@DIR@\"\n"); at != std::string::npos)
    table.replace(at, 17,
                  "preset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\nn_kv_head = 2\n"
                  "intermediate_size = 80\nmax_positions = 64\n");
  std::string strategies;
  if (const auto at = table.find("@QLORA@"); at != std::string::npos) {
    table.erase(at, 7);
    strategies =
        "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"v\", \"down\"]\nrank = 4\n"
        "[[strategy]]\nplugin = \"quantize\"\nformat = \"nf4\"\n";
  }
  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str(), "", strategies);
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin, "[model]\n" + table + "\n");
  auto s = test::make_session(recipe);
  s->update().optimizer().set_lr(1e-2);
  s->train();
  const std::string out = s->export_hf(dir.str() + "/hf");
  expect_transformers_reproduces(*s, out);
}

INSTANTIATE_TEST_SUITE_P(
    Families, HfRoundTrip,
    ::testing::Values(
        Family{"gpt2",
               "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = "
               "2\nn_positions = 64\n",
               0},
        Family{"llama", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 0},
        Family{"llama_bias", "plugin = \"llama\"\n@PEER@", 0},
        Family{"mistral", "plugin = \"llama\"\n@PEER@", 0},
        Family{"qwen2", "plugin = \"llama\"\n@PEER@", 0},
        Family{"qwen3", "plugin = \"llama\"\n@PEER@", 0},
        Family{"gemma", "plugin = \"llama\"\n@PEER@", 0},
        Family{"gemma2", "plugin = \"llama\"\n@PEER@", 0},
        Family{"gemma3_text", "plugin = \"llama\"\n@PEER@", 0},
        Family{"phi3", "plugin = \"llama\"\n@PEER@", 0},
        Family{"mixtral", "plugin = \"llama\"\n@PEER@", 0},
        Family{"qwen2_moe", "plugin = \"llama\"\n@PEER@", 0},
        Family{"qwen3_moe", "plugin = \"llama\"\n@PEER@", 0},
        Family{"olmoe", "plugin = \"llama\"\n@PEER@", 0},
        Family{"gpt2_inner", "plugin = \"gpt2\"\n@PEER@", 0},
        Family{"rwkv",
               "plugin = \"rwkv\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nwkv_chunk = 7\n",
               0},
        // A trained QLoRA model exports its adapters merged into dequantized bases.
        Family{"qlora", "plugin = \"llama\"\nconfig = \"@DIR@\"\n@QLORA@", 0}),
    [](const ::testing::TestParamInfo<Family>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

TEST(HfWeights, ShardedFolderWithIndexLoads) {
  test::TempDir dir;
  const std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str());
  auto a = test::make_session(recipe);
  // Split the exported tensors over two shards, as save_pretrained does for big models.
  auto tensors = export_hf_weights(a->store());
  std::map<std::string, at::Tensor> shard[2];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  int i = 0;
  for (auto& [name, t] : tensors) {
    const int k = i++ % 2;
    shard[k][name] = t * 2;  // distinguishable from a fresh init
    index["weight_map"][name] = "model-0000" + std::to_string(k + 1) + "-of-00002.safetensors";
  }
  std::filesystem::create_directories(dir.path() / "sharded");
  for (int k = 0; k < 2; ++k)
    write_safetensors(
        (dir.path() / "sharded" / ("model-0000" + std::to_string(k + 1) + "-of-00002.safetensors"))
            .string(),
        shard[k]);
  test::write_file(dir, "sharded/model.safetensors.index.json", index.dump());
  std::string r = recipe;
  r.replace(r.find("n_positions = 64\n"), 17,
            "n_positions = 64\nweights = \"" + dir.str() + "/sharded\"\n");
  auto b = test::make_session(r);
  for (const Param& p : b->store().all())
    EXPECT_TRUE(at::equal(p.value, a->store().get(p.name).value * 2)) << p.name;
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// Export streams a shard at a time: a QLoRA model (every exported weight a
// dequantized, merged copy) written in shards of an eighth of its size peaks
// at a fraction of the one-file export's transient memory; transformers loads
// the shards through their index and computes tightfit's logits, and tightfit
// reads them back.
TEST(HfExport, ShardedExportStreamsAndTransformersLoadsIt) {
  test::TempDir dir;
  const std::string model =
      "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 8\nn_embd = 128\nn_head = 4\n"
      "n_kv_head = 2\nintermediate_size = 352\nmax_positions = 64\n";
  std::string recipe =
      test::tiny_recipe(test::write_corpus(dir), dir.str(), "",
                        "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"v\"]\nrank = 4\n"
                        "[[strategy]]\nplugin = \"quantize\"\nformat = \"nf4\"\n");
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin, "[model]\n" + model + "\n");
  auto s = test::make_session(recipe);
  s->train();
  int64_t model_bytes = 0;
  for (const Param& p : s->store().all())
    if (!(p.flags & TF_PARAM_ADAPTER)) model_bytes += 4 * c10::multiply_integers(p.shape);
  auto transient_peak = [&](const std::string& out, int64_t shard) {
    MemoryAccounting::instance().reset_peaks();
    const int64_t before = MemoryAccounting::instance().snapshot().current[TF_MEM_TRANSIENT];
    s->export_hf(out, true, shard);
    return MemoryAccounting::instance().snapshot().peak[TF_MEM_TRANSIENT] - before;
  };
  const int64_t whole = transient_peak(dir.str() + "/one", 5'000'000'000);
  const int64_t sharded = transient_peak(dir.str() + "/shards", model_bytes / 8);
  std::cout << "export of a " << model_bytes << "-byte model: transient peak " << whole
            << " bytes in one file, " << sharded << " in shards of " << model_bytes / 8 << "\n";
  RecordProperty("model_bytes", std::to_string(model_bytes));
  RecordProperty("one_file_peak", std::to_string(whole));
  RecordProperty("sharded_peak", std::to_string(sharded));
  EXPECT_GT(whole, model_bytes / 2);
  EXPECT_LT(sharded, model_bytes / 3);
  const std::string out = dir.str() + "/shards";
  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(out + "/model-00001-of-00009.safetensors") ||
              std::filesystem::exists(out + "/model-00001-of-00010.safetensors") ||
              std::filesystem::exists(out + "/model-00001-of-00011.safetensors"));
  const auto [tokens, logits] = expect_transformers_reproduces(*s, out);
  // tightfit reads the shards back: the same logits.
  std::string back = test::tiny_recipe(test::write_corpus(dir), dir.str());
  back.replace(
      back.find("[model]"), back.find("[data]") - back.find("[model]"),
      "[model]\nplugin = \"llama\"\nconfig = \"" + out + "\"\nweights = \"" + out + "\"\n\n");
  auto r = test::make_session(back);
  at::NoGradGuard no_grad;
  EXPECT_LE((r->executor().forward_logits(tokens, false) - logits).abs().max().item<double>(),
            1e-4);
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// A session of the llama plugin on `config_json` (written as a model folder's
// config.json), or the error it stops with.
struct ConfigOutcome {
  std::unique_ptr<Session> session;
  std::string error;
};
ConfigOutcome session_for_config(const test::TempDir& dir, const std::string& name,
                                 const nlohmann::json& config_json) {
  const std::string folder = dir.str() + "/" + name;
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/config.json") << config_json.dump();
  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str());
  recipe.replace(recipe.find("[model]"), recipe.find("[data]") - recipe.find("[model]"),
                 "[model]\nplugin = \"llama\"\nconfig = \"" + folder + "\"\n\n");
  ConfigOutcome out;
  try {
    out.session = test::make_session(recipe);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

nlohmann::json small_gemma3() {
  return {
      {"model_type", "gemma3_text"}, {"num_hidden_layers", 4},   {"hidden_size", 32},
      {"num_attention_heads", 4},    {"num_key_value_heads", 2}, {"head_dim", 16},
      {"intermediate_size", 80},     {"vocab_size", 256},        {"max_position_embeddings", 64},
      {"sliding_window", 5}};
}

// Gemma 3 configs on the Hub give the pattern (every n-th layer full) rather
// than layer_types; the exported config spells it out as transformers reads it.
TEST(GemmaConfig, SlidingWindowPatternBecomesLayerTypes) {
  test::TempDir dir;
  nlohmann::json config = small_gemma3();
  config["sliding_window_pattern"] = 3;
  ConfigOutcome o = session_for_config(dir, "pattern", config);
  ASSERT_TRUE(o.session) << o.error;
  const std::string out = o.session->export_hf(dir.str() + "/hf");
  std::ifstream in(out + "/config.json");
  const nlohmann::json written = nlohmann::json::parse(in);
  EXPECT_EQ(written["layer_types"], nlohmann::json({"sliding_attention", "sliding_attention",
                                                    "full_attention", "sliding_attention"}));
  EXPECT_EQ(written["model_type"], "gemma3_text");
  // transformers' default: five sliding layers in six (all four here).
  config.erase("sliding_window_pattern");
  o = session_for_config(dir, "default", config);
  ASSERT_TRUE(o.session) << o.error;
  std::ifstream in2(o.session->export_hf(dir.str() + "/hf2") + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(in2)["layer_types"],
            nlohmann::json(std::vector<std::string>(4, "sliding_attention")));
}

// A config.json key a test sets, and the fix its refusal must name.
struct RefusedKey {
  const char* model_type;
  const char* key;
  nlohmann::json value;
  const char* expect;
};

// The session of `config` fails, its error naming `needle` (the key), the
// fix and the config.json.
void expect_refused(const test::TempDir& dir, const std::string& name, const nlohmann::json& config,
                    const RefusedKey& c, const std::string& needle) {
  const ConfigOutcome o = session_for_config(dir, name, config);
  EXPECT_FALSE(o.session) << c.model_type << " " << c.key;
  EXPECT_NE(o.error.find(needle), std::string::npos) << o.error;
  EXPECT_NE(o.error.find(c.expect), std::string::npos) << o.error;
  EXPECT_NE(o.error.find("config.json"), std::string::npos) << o.error;
}

// Keys whose maths transformers would not apply here, or that are not a
// causal language model, are refused by name rather than ignored.
TEST(GemmaConfig, KeysTransformersDoesNotApplyAreRefusedByName) {
  test::TempDir dir;
  const std::vector<RefusedKey> cases = {
      {"gemma3_text", "attn_logit_softcapping", 50.0, "set it to null"},
      {"gemma3_text", "use_bidirectional_attention", true, "set it to false"},
      {"gemma", "final_logit_softcapping", 30.0, "gemma2 and gemma3_text only"},
      {"llama", "attn_logit_softcapping", 50.0, "gemma2 and gemma3_text only"},
  };
  int n = 0;
  for (const RefusedKey& c : cases) {
    nlohmann::json config = small_gemma3();
    config["model_type"] = c.model_type;
    config[c.key] = c.value;
    expect_refused(dir, "c" + std::to_string(++n), config, c, std::string("\"") + c.key + "\"");
  }
  // null is None: no cap, accepted.
  nlohmann::json config = small_gemma3();
  config["attn_logit_softcapping"] = nullptr;
  EXPECT_TRUE(session_for_config(dir, "null_cap", config).session);
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

nlohmann::json small_moe(const char* model_type) {
  return {{"model_type", model_type},
          {"num_hidden_layers", 2},
          {"hidden_size", 32},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"intermediate_size", 48},
          {"vocab_size", 256},
          {"max_position_embeddings", 64},
          {"num_experts", 4},
          {"num_local_experts", 4},
          {"num_experts_per_tok", 2},
          {"moe_intermediate_size", 24},
          {"shared_expert_intermediate_size", 40}};
}

// What transformers would compute differently, or tightfit does not compute
// yet, is refused by name with the fix; the same configs without the key load.
TEST(MoeConfig, KeysTightfitWouldNotMatchAreRefusedByName) {
  test::TempDir dir;
  const std::vector<RefusedKey> cases = {
      {"mixtral", "router_aux_loss_coef", -0.01, "out of range"},
      {"mixtral", "router_jitter_noise", 0.01, "set it to 0.0"},
      {"qwen2_moe", "use_sliding_window", true, "set it to false"},
      {"olmoe", "head_dim", 16, "remove the key"},
      {"qwen3_moe", "num_experts_per_tok", 5, "exceeds the 4 experts"},
  };
  int n = 0;
  for (const RefusedKey& c : cases) {
    nlohmann::json config = small_moe(c.model_type);
    const ConfigOutcome plain = session_for_config(dir, "p" + std::to_string(++n), config);
    EXPECT_TRUE(plain.session) << c.model_type << ": " << plain.error;
    config[c.key] = c.value;
    expect_refused(dir, "c" + std::to_string(n), config, c, c.key);
  }
}

// Qwen-MoE's layer rule (decoder_sparse_step, mlp_only_layers) decides which
// blocks hold experts, also after an n_layer override; each expert's weights
// are parameters of their own.
TEST(MoeConfig, SparseStepAndMlpOnlyLayersPickTheExpertBlocks) {
  test::TempDir dir;
  nlohmann::json config = small_moe("qwen3_moe");
  config["num_hidden_layers"] = 6;
  config["decoder_sparse_step"] = 2;
  config["mlp_only_layers"] = {3};
  const ConfigOutcome o = session_for_config(dir, "q", config);
  ASSERT_TRUE(o.session) << o.error;
  std::vector<int> expert_blocks, dense_blocks;
  for (int l = 0; l < 6; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".mlp.";
    if (o.session->store().find(prefix + "experts.3.down_proj.weight")) expert_blocks.push_back(l);
    if (o.session->store().find(prefix + "down_proj.weight")) dense_blocks.push_back(l);
  }
  EXPECT_EQ(expert_blocks, (std::vector<int>{1, 5}));
  EXPECT_EQ(dense_blocks, (std::vector<int>{0, 2, 3, 4}));
  const Param* router = o.session->store().find("model.layers.1.mlp.gate.weight");
  ASSERT_TRUE(router);
  EXPECT_EQ(router->value.sizes(), (at::IntArrayRef{4, 32}));
}

}  // namespace
}  // namespace tightfit
