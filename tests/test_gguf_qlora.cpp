// QLoRA on a GGUF file's own blocks ([[strategy]] quantize, format =
// "gguf"): the frozen base stays in the file's quantized types (Q4_0 ...
// Q8_0, F16, the K-quants; tests/peers/gguf_qlora.py), decoded by the
// kernel's ggml dequantizers when a block computes. The run is the LoRA run
// on the file dequantized at load, exactly: the same base values, losses and
// adapters; it stores the file's bytes and the plan counts them; it
// resumes exactly; weights that are not a GGUF file are refused with the fix.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gguf_file.hpp"
#include "gguf_model.hpp"
#include "gguf_recipe.hpp"
#include "hf_weights.hpp"
#include "input_files.hpp"
#include "plan_recipes.hpp"
#include "recipe.hpp"
#include "safetensors.hpp"
#include "session.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

class GgufQlora : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string d = dir_->str();
    ASSERT_EQ(std::system((test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                           "/tests/peers/gguf_qlora.py " + d + " > " + d + "/peer.log 2>&1")
                              .c_str()),
              0)
        << "tests/peers/gguf_qlora.py failed (see " << d
        << "/peer.log); scripts/setup installs gguf";
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string file() { return dir_->str() + "/mixed.gguf"; }

  // The tiny recipe with the GGUF file as its model and tokenizer, LoRA on
  // every projection.
  static std::string recipe(const std::string& weights, const std::string& extra,
                            const std::string& out = "runs") {
    std::string r = test::tiny_recipe(
        "builtin:fortunes", dir_->str() + "/" + out, "",
        "[[strategy]]\nplugin = \"lora\"\nrank = 4\nalpha = 8\ntargets = [\"q\", \"k\", \"v\", "
        "\"o\", \"gate\", \"up\", \"down\"]\n" +
            extra);
    r.replace(r.find("tokenizer = \"byte\""), 18, "tokenizer = \"auto\"");
    const auto begin = r.find("[model]"), end = r.find("[data]");
    r.replace(begin, end - begin,
              "[model]\nplugin = \"llama\"\nconfig = \"" + file() + "\"\n" +
                  (weights.empty() ? "" : "weights = \"" + weights + "\"\n") + "\n");
    return r;
  }
  static constexpr const char* kGguf = "[[strategy]]\nplugin = \"quantize\"\nformat = \"gguf\"\n";
  static test::TempDir* dir_;
};
test::TempDir* GgufQlora::dir_ = nullptr;

// Every frozen block matrix is kept as the file's bytes (one byte of store
// per byte of file), decodes to exactly what the dense load holds, and the
// two runs take the same steps bit for bit.
TEST_F(GgufQlora, TrainsExactlyAsTheDequantizedBaseFromTheFilesOwnBytes) {
  auto plain = test::make_session(recipe(file(), ""));
  auto kept = test::make_session(recipe(file(), kGguf));
  const gguf::GgufReader r(file());
  int64_t matrices = 0, file_bytes = 0, stored_bytes = 0;
  for (const Param& p : kept->store().all()) {
    if (p.shape.size() != 2 || p.stage < 0 || (p.flags & TF_PARAM_ADAPTER) ||
        p.name.find("embed") != std::string::npos || p.name.find("lm_head") != std::string::npos)
      continue;
    ++matrices;
    EXPECT_EQ(p.format, TF_FORMAT_GGML) << p.name;
    EXPECT_EQ(p.value.scalar_type(), at::kByte) << p.name;
    stored_bytes += p.value.numel();
    EXPECT_TRUE(at::equal(kept->executor().fetch_weight(p.name), plain->store().get(p.name).value))
        << p.name << " does not decode to the dense load's values";
  }
  for (const gguf::TensorInfo& t : r.tensors())  // the blocks' matrices
    if (t.dims.size() == 2 && t.name.rfind("blk.", 0) == 0)
      file_bytes += static_cast<int64_t>(t.bytes);
  EXPECT_EQ(matrices, 14);  // 2 layers x 7 projections
  EXPECT_EQ(stored_bytes, file_bytes);

  test::expect_the_same_steps(*plain, *kept);
  int adapters = 0;
  for (const Param& p : plain->store().all())
    if (p.flags & TF_PARAM_ADAPTER) {
      ++adapters;
      EXPECT_TRUE(at::equal(p.value, kept->store().get(p.name).value)) << p.name;
    }
  EXPECT_EQ(adapters, 28);
}

// The plan counts the file's blocks as the weights (within the 2% the
// planner's other tests hold), before anything is loaded.
TEST_F(GgufQlora, ThePlanCountsTheFilesBlocks) {
  const std::string text = recipe(file(), kGguf);
  const MemoryPlan plan = test::plan_of(text);
  const TrainSummary sum = test::make_session(text)->train();
  const int64_t planned = plan.device_peak_by_category[TF_MEM_WEIGHTS],
                measured = sum.memory.peak[TF_MEM_WEIGHTS];
  EXPECT_LE(std::abs(test::relative(planned, measured)), 0.02)
      << "planned " << planned << ", measured " << measured;
  const MemoryPlan dense = test::plan_of(recipe(file(), ""));
  EXPECT_LT(planned, dense.device_peak_by_category[TF_MEM_WEIGHTS]);
}

// A checkpointed run resumes exactly: the blocks come from the file again
// (nothing of them is in the checkpoint) and the adapters from the step.
TEST_F(GgufQlora, ResumesExactly) {
  auto run = [&](const std::string& out, bool resume, int64_t stop) {
    std::string r = recipe(file(), kGguf, out);
    r.replace(r.find("steps = 4"), 9, "steps = 8");
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop;
    return test::make_session(r, o)->train();
  };
  const TrainSummary full = run("whole", false, -1);
  run("halves", false, 4);
  const TrainSummary rest = run("halves", true, -1);
  ASSERT_EQ(full.losses.size(), 8u);
  ASSERT_EQ(rest.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rest.losses[i], full.losses[4 + i]) << "step " << 4 + i;
}

// No GGUF file to keep blocks of: refused, naming the key and the fix.
TEST_F(GgufQlora, WeightsThatAreNotAGgufFileAreRefusedWithTheFix) {
  test::make_session(recipe(file(), ""))->export_hf(dir_->str() + "/hf");  // as safetensors
  for (const std::string& weights : {std::string(), dir_->str() + "/hf/model.safetensors"}) {
    std::string message;
    try {
      std::string text = recipe(weights, kGguf);  // the exported folder's tokenizer
      text.replace(text.find("tokenizer = \"auto\""), 18, "tokenizer = \"" + dir_->str() + "/hf\"");
      test::make_session(text);
    } catch (const std::exception& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("format = \"gguf\""), std::string::npos) << message;
    EXPECT_NE(message.find("nf4"), std::string::npos) << message;
    EXPECT_NE(message.find(weights.empty() ? "no [model] weights" : "not a GGUF file"),
              std::string::npos)
        << message;
  }
}

// The PEFT adapter of a run whose base is a GGUF file loads the documented
// way, AutoPeftModelForCausalLM.from_pretrained(adapter): the export writes
// the base it applies to (the GGUF as the run read it) beside it as a
// Hugging Face folder and names it as base_model_name_or_path (the folder
// holding the .gguf, which transformers cannot load, before). PEFT's logits
// equal tightfit's within 1e-4.
TEST_F(GgufQlora, AnAdapterOnAGgufBaseLoadsWithAutoPeftModel) {
  auto s = test::make_session(recipe(file(), ""));
  s->update().optimizer().set_lr(1e-2);
  s->train();
  const std::string out = dir_->str() + "/auto-peft";
  s->export_adapter(out + "/adapter");
  const std::string base = std::filesystem::absolute(out + "/adapter/base").string();
  ASSERT_TRUE(std::filesystem::exists(base + "/config.json"));
  ASSERT_TRUE(std::filesystem::exists(base + "/model.safetensors"));
  const nlohmann::json config =
      nlohmann::json::parse(std::ifstream(out + "/adapter/adapter_config.json"));
  EXPECT_EQ(config["base_model_name_or_path"], base);
  const at::Tensor tokens = at::randint(0, 200, {2, 16}, at::kLong);
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = s->executor().forward_logits(tokens, false);
  }
  write_safetensors(out + "/expected.safetensors", {{"tokens", tokens}, {"logits", logits}});
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                          "/tests/peers/peft_adapter.py " + out + " --auto > " + out +
                          "/peer.log 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0)
      << "AutoPeftModelForCausalLM did not reproduce tightfit's logits:\n"
      << std::string(std::istreambuf_iterator<char>(std::ifstream(out + "/peer.log").rdbuf()), {});
}

// Base weights are checked finite where they enter, naming the tensor: a GGUF
// file read dense or kept as its blocks (a NaN scale), and a safetensors
// folder. An input error (exit 2), never a run that trains on NaN.
TEST_F(GgufQlora, ANonFiniteBaseWeightIsRefusedNamingTheTensor) {
  const gguf::GgufReader r(file());
  const gguf::TensorInfo* target = nullptr;
  for (const gguf::TensorInfo& t : r.tensors()) {  // a type whose first two bytes are an f16
    const std::string type = t.type->name;
    if (t.name.rfind("blk.", 0) == 0 && t.dims.size() == 2 &&
        (type == "F16" || type == "Q8_0" || type == "Q4_0" || type == "Q4_K" || type == "Q5_K")) {
      target = &t;
      break;
    }
  }
  ASSERT_NE(target, nullptr);
  const std::string bad = dir_->str() + "/nan.gguf";
  std::filesystem::copy_file(file(), bad, std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(r.data_offset() + target->offset));
    const unsigned char nan_f16[2] = {0x00, 0x7E};
    f.write(reinterpret_cast<const char*>(nan_f16), 2);
  }
  // A session names the recipe's weights key before the file and tensor (a
  // recipe error: exit 2).
  auto refusal = [&](const std::string& text) -> std::string {
    try {
      test::make_session(text);
    } catch (const RecipeError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("not a recipe error: ") + e.what();
    }
    return "loaded";
  };
  for (const char* extra : {"", kGguf}) {
    std::string text = recipe(bad, extra);
    text.replace(text.find("config = \"" + file()), 10 + file().size(), "config = \"" + bad);
    const std::string message = refusal(text);
    EXPECT_NE(message.find(": " + bad + ": tensor \"model.layers."), std::string::npos)
        << extra << message;
    EXPECT_EQ(message.find("not a recipe error"), std::string::npos) << message;
    EXPECT_NE(message.find("holds a NaN or infinity"), std::string::npos) << message;
  }
  // The file's own blocks, as the quantize strategy keeps them: decoded to
  // look, the NaN scale found in its row.
  {
    const HfWeightSource source(bad);
    Param p;
    std::string hf_name;
    std::string message;
    for (const char* name :
         {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
          "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
          "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
          "model.layers.0.mlp.down_proj.weight"}) {
      p.name = name;
      try {
        const gguf::HfBlocks shape = gguf::read_hf_blocks(r, hf_config(r), name, false);
        p.shape = {shape.rows, shape.cols};
        source.blocks(p, true);
      } catch (const InputError& e) {
        message = e.what();
        hf_name = name;
      } catch (const std::exception&) {
      }
    }
    EXPECT_EQ(message,
              bad + ": tensor \"" + hf_name +
                  "\" holds a NaN or infinity (in row 0); the file is damaged or was saved "
                  "from a diverged run: use another copy of the model");
  }
  // A safetensors folder: one value of one tensor made infinite.
  const std::string hf = dir_->str() + "/hf-inf";
  test::make_session(recipe(file(), ""))->export_hf(hf);
  {
    const SafetensorsReader in(hf + "/model.safetensors");
    SafetensorsWriter out(hf + "/model.safetensors.new");
    for (const std::string& name : in.names()) {
      at::Tensor t = in.read(name);
      if (name == "model.layers.1.mlp.up_proj.weight") t.view(-1)[5] = INFINITY;
      out.put(name, t);
    }
    out.finish();
  }
  std::filesystem::rename(hf + "/model.safetensors.new", hf + "/model.safetensors");
  std::string text = recipe(hf, "");
  text.replace(text.find("config = \"" + file()), 10 + file().size(), "config = \"" + hf);
  const std::string message = refusal(text);
  EXPECT_NE(message.find(": " + hf +
                         "/model.safetensors: tensor \"model.layers.1.mlp.up_proj.weight\" "
                         "holds a NaN or infinity (first at element 5)"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace tightfit
