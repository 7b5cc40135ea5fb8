// Disk offload of frozen weights: exact (same gradients and losses as keeping
// them in memory), and at most prefetch + 1 stages' weights resident.
#include <c10/util/accumulate.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "memory_plan.hpp"
#include "safetensors.hpp"
#include "step_cost.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

class OffloadTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& strategies) const {
    std::string r = test::tiny_recipe(
        corpus, dir.str(), "",
        "[[strategy]]\nplugin = \"lora\"\ntargets = [\"c_attn\", \"c_fc\"]\nrank = 4\n" +
            strategies);
    r.replace(r.find("n_layer = 2"), 11, "n_layer = 6");
    r.replace(r.find("n_embd = 32"), 11, "n_embd = 64");
    return r;
  }
};

TEST_F(OffloadTest, SameGradientsAsInMemoryAlsoWithCheckpointing) {
  for (const std::string tier : {"disk", "host"})
    for (const std::string extra : {"", "[[strategy]]\nplugin = \"checkpoint\"\n"}) {
      auto plain = test::make_session(recipe(extra));
      auto off = test::make_session(recipe(
          "[[strategy]]\nplugin = \"offload\"\nprefetch = 1\nparams = \"" + tier + "\"\n" + extra));
      EXPECT_EQ(off->store().get("transformer.h.3.mlp.c_fc.weight").residency,
                tier == "disk" ? TF_TIER_DISK : TF_TIER_HOST);
      EXPECT_EQ(off->store().get("transformer.h.3.mlp.c_fc.weight").value.numel(), 0);
      for (int step = 0; step < 3; ++step) {
        auto b = plain->data().batcher().next();
        off->data().batcher().next();
        plain->update().zero_grad();
        off->update().zero_grad();
        const double lp = plain->executor().run_pass(b.tokens, b.targets, true, 1.0).loss;
        const double lo = off->executor().run_pass(b.tokens, b.targets, true, 1.0).loss;
        EXPECT_EQ(lp, lo) << "step " << step;
        for (Param* p : plain->store().trainable())
          EXPECT_TRUE(at::equal(p->value.grad(), off->store().get(p->name).value.grad()))
              << p->name;
        plain->update().optimizer_step();
        off->update().optimizer_step();
      }
    }
}

TEST_F(OffloadTest, AtMostPrefetchPlusOneStagesResident) {
  auto plain = test::make_session(recipe(""));
  int64_t block_bytes = 0, offloadable = 0;
  for (const Param& p : plain->store().all())
    if (!p.trainable && p.stage >= 1 && p.stage <= 6 && p.shape.size() == 2) {
      offloadable += p.numel() * 4;
      if (p.stage == 1) block_bytes += p.numel() * 4;
    }
  plain.reset();
  for (int prefetch : {0, 1, 2}) {
    auto& acct = MemoryAccounting::instance();
    const int64_t before = acct.snapshot().current[TF_MEM_WEIGHTS];
    auto s = test::make_session(recipe(
        "[[strategy]]\nplugin = \"offload\"\nprefetch = " + std::to_string(prefetch) + "\n"));
    const int64_t resident_base = acct.snapshot().current[TF_MEM_WEIGHTS] - before;
    acct.reset_peaks();
    auto b = s->data().batcher().next();
    s->executor().run_pass(b.tokens, b.targets, true, 1.0);
    const int64_t peak = acct.snapshot().peak[TF_MEM_WEIGHTS] - before - resident_base;
    // (slack of a tenth of a block for small buffers counted as weights while a stage is read)
    EXPECT_LE(peak, (prefetch + 1) * block_bytes + block_bytes / 10) << "prefetch " << prefetch;
    if (prefetch <= 1) {  // 6 blocks: 1 or 2 resident
      EXPECT_LT(peak, offloadable / 2);
    }
  }
}

// QLoRA with the NF4 codes on disk: quantize converts each stage as soon as
// it exists and offload writes the codes out (streaming setup), so the fp32
// model is never whole; training and export match QLoRA in memory.
class QloraOffloadTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& extra, const std::string& model_extra = "") const {
    std::string r = test::tiny_recipe(
        corpus, dir.str(), model_extra,
        "[[strategy]]\nplugin = \"lora\"\ntargets = [\"c_attn\", \"c_fc\"]\nrank = 4\n"
        "[[strategy]]\nplugin = \"quantize\"\nformat = \"nf4\"\n" +
            extra);
    r.replace(r.find("n_layer = 2"), 11, "n_layer = 6");
    r.replace(r.find("n_embd = 32"), 11, "n_embd = 128");
    return r;
  }
  static constexpr const char* kOffload = "[[strategy]]\nplugin = \"offload\"\nprefetch = 1\n";
};

TEST_F(QloraOffloadTest, SameGradientsAsQloraInMemoryAlsoWithCheckpointing) {
  for (const std::string extra : {"", "[[strategy]]\nplugin = \"checkpoint\"\n"}) {
    auto mem = test::make_session(recipe(extra));
    auto off = test::make_session(recipe(kOffload + extra));
    const Param& w = off->store().get("transformer.h.3.mlp.c_fc.weight");
    EXPECT_EQ(w.format, TF_FORMAT_NF4);
    EXPECT_EQ(w.residency, TF_TIER_DISK);
    EXPECT_EQ(w.value.numel(), 0);  // the codes are in a file
    for (int step = 0; step < 3; ++step) {
      auto b = mem->data().batcher().next();
      off->data().batcher().next();
      mem->update().zero_grad();
      off->update().zero_grad();
      EXPECT_EQ(mem->executor().run_pass(b.tokens, b.targets, true, 1.0).loss,
                off->executor().run_pass(b.tokens, b.targets, true, 1.0).loss);
      for (Param* p : mem->store().trainable())
        EXPECT_TRUE(at::equal(p->value.grad(), off->store().get(p->name).value.grad())) << p->name;
      mem->update().optimizer_step();
      off->update().optimizer_step();
    }
    EXPECT_EQ(off->store().get("transformer.h.3.mlp.c_fc.weight").value.numel(),
              0);  // swapped out again
  }
}

TEST_F(QloraOffloadTest, TheDenseModelIsNeverWholeDuringSetup) {
  auto& acct = MemoryAccounting::instance();
  int64_t dense_blocks = 0, one_block = 0, outside_blocks = 0;
  { auto probe = test::make_session(test::tiny_recipe(corpus, dir.str() + "/probe", "")); }
  {
    std::string r = recipe("");
    auto mem = test::make_session(r);
    for (const Param& p : mem->store().all()) {
      if (p.flags & TF_PARAM_ADAPTER) continue;
      const int64_t bytes = p.numel() * 4;
      if (p.stage >= 1 && p.stage <= 6) {
        dense_blocks += bytes;
        if (p.stage == 1) one_block += bytes;
      } else {
        outside_blocks += bytes;
      }
    }
  }
  const int64_t before = acct.snapshot().current[TF_MEM_WEIGHTS];
  acct.reset_peaks();
  auto off = test::make_session(recipe(kOffload));
  const int64_t peak = acct.snapshot().peak[TF_MEM_WEIGHTS] - before;
  // Embeddings, final norm, and one block in fp32 while it is converted
  // (plus its codes); never the six blocks together.
  EXPECT_LE(peak, outside_blocks + one_block + one_block / 4) << "all blocks: " << dense_blocks;
  EXPECT_LT(peak, outside_blocks + dense_blocks / 2);
  // After setup only the non-block weights and the small NF4 scales remain.
  EXPECT_LT(acct.snapshot().current[TF_MEM_WEIGHTS] - before, outside_blocks + dense_blocks / 20);
}

TEST_F(QloraOffloadTest, ExportAndWeightsFoldersWorkThroughTheDiskTier) {
  // Export brings each offloaded weight in for the access (TF_PHASE_ACCESS).
  auto mem = test::make_session(recipe(""));
  auto off = test::make_session(recipe(kOffload));
  for (auto* s : {mem.get(), off.get()}) {
    s->update().optimizer().set_lr(1e-2);
    for (int i = 0; i < 2; ++i) {
      s->update().zero_grad();
      auto b = s->data().batcher().next();
      s->executor().run_pass(b.tokens, b.targets, true, 1.0);
      s->update().optimizer_step();
    }
  }
  mem->export_hf(dir.str() + "/mem");
  off->export_hf(dir.str() + "/off");
  const SafetensorsFile a = read_safetensors(dir.str() + "/mem/model.safetensors");
  const SafetensorsFile b = read_safetensors(dir.str() + "/off/model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) EXPECT_TRUE(at::equal(t, b.tensors.at(name))) << name;
  EXPECT_EQ(off->store().get("transformer.h.3.mlp.c_fc.weight").value.numel(), 0);

  // Starting from a model folder streams it in stage by stage: same logits.
  const std::string weights = "weights = \"" + dir.str() + "/mem\"\n";
  auto from_mem = test::make_session(recipe("", weights));
  auto from_off = test::make_session(recipe(kOffload, weights));
  const at::Tensor tokens = at::randint(0, 256, {2, 16}, at::kLong);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(from_mem->executor().forward_logits(tokens, false),
                        from_off->executor().forward_logits(tokens, false)));
}

// Optimizer state on the disk tier: the update runs where the state lives and
// gives the same weights as the kernel's own AdamW (and SGD with momentum),
// alone and with checkpointing and fused updates; the kernel keeps no state.
class OffloadOptimizerTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& strategies, const std::string& out,
                     const std::string& optimizer = "") const {
    std::string r = test::tiny_recipe(corpus, out, "", strategies);
    r.replace(r.find("n_layer = 2"), 11, "n_layer = 3");
    r.replace(r.find("lr = 1e-3"), 9, optimizer.empty() ? "lr = 1e-3\ngrad_clip = 0.0" : optimizer);
    r.replace(r.find("steps = 4"), 9, "steps = 6");
    return r;
  }
  static std::map<std::string, at::Tensor> weights(Session& s) {
    std::map<std::string, at::Tensor> out;  // fetch_weight brings in what a tier keeps
    for (const Param& p : s.store().all())
      out[p.name] = s.executor().fetch_weight(p.name).detach().clone();
    return out;
  }
  static constexpr const char* kOffload =
      "[[strategy]]\nplugin = \"offload\"\noptimizer = \"disk\"\n";
  // The tier's update runs on the CPU, where its state is (as ZeRO-Offload's
  // CPU Adam). On a CPU run so does the kernel's: the same bits. On a GPU the
  // kernel's update runs in CUDA's elementwise kernels, which fuse a * b + c
  // into one rounding: the same weights to rounding, not to the bit.
  static bool same_weights(const at::Tensor& got, const at::Tensor& expected) {
    if (test::test_device().rfind("cuda", 0) != 0) return at::equal(got, expected);
    return at::allclose(got, expected, /*rtol=*/1e-5, /*atol=*/1e-7);
  }
};

TEST_F(OffloadOptimizerTest, SameWeightsAsTheKernelsOptimizerInAnyStack) {
  const std::string ckpt = "[[strategy]]\nplugin = \"checkpoint\"\n";
  const std::string fused = "[[strategy]]\nplugin = \"fused_update\"\nclip = \"none\"\n";
  for (const std::string& opt :
       {std::string(), std::string("name = \"sgd\"\nlr = 0.05\nmomentum = 0.9\ngrad_clip = 0.0")}) {
    auto plain = test::make_session(recipe("", dir.str() + "/plain", opt));
    plain->train();
    const auto expected = weights(*plain);
    for (const std::string& stack : {std::string(kOffload), kOffload + ckpt, kOffload + fused}) {
      test::TempDir out;
      auto s = test::make_session(recipe(stack, out.str(), opt));
      s->train();
      EXPECT_EQ(s->update().optimizer().state_bytes(), 0) << stack;  // the tier holds it
      for (const auto& [name, w] : expected)
        EXPECT_TRUE(same_weights(weights(*s).at(name), w)) << name << " with\n" << stack << opt;
    }
  }
}

// Trained block weights on disk too (ZeRO-Infinity style): each stays the
// same autograd leaf while its bytes come and go; updates run where the
// state is. The plain run's weights (same_weights), in any stack, and resumable.
TEST_F(OffloadOptimizerTest, TrainedWeightsOnDiskGiveTheSameWeights) {
  const std::string all =
      "[[strategy]]\nplugin = \"offload\"\nparams = \"disk\"\ntrainable = true\n"
      "optimizer = \"disk\"\nprefetch = 1\n";
  const std::string ckpt = "[[strategy]]\nplugin = \"checkpoint\"\n";
  const std::string fused = "[[strategy]]\nplugin = \"fused_update\"\nclip = \"none\"\n";
  auto plain = test::make_session(recipe("", dir.str() + "/plain"));
  plain->train();
  const auto expected = weights(*plain);
  for (const std::string& stack : {all, all + ckpt, all + fused, ckpt + fused + all}) {
    test::TempDir out;
    auto s = test::make_session(recipe(stack, out.str()));
    const Param& w = s->store().get("transformer.h.1.mlp.c_fc.weight");
    EXPECT_TRUE(w.trainable);
    EXPECT_EQ(w.residency, TF_TIER_DISK);
    EXPECT_EQ(w.value.storage().nbytes(), 0u);  // its bytes are in a file between uses
    s->train();
    EXPECT_EQ(s->store().get("transformer.h.1.mlp.c_fc.weight").value.storage().nbytes(), 0u);
    const auto got = weights(*s);  // (a snapshot brings each weight in)
    for (const auto& [name, t] : expected)
      EXPECT_TRUE(same_weights(got.at(name), t)) << name << " with\n" << stack;
  }
  // Interrupted and resumed: the same losses.
  auto run = [&](const std::string& out, bool resume, int64_t stop) {
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop;
    return test::make_session(recipe(all + ckpt, out), o)->train();
  };
  const TrainSummary full = run(dir.str() + "/a", false, -1);
  run(dir.str() + "/b", false, 3);
  const TrainSummary rest = run(dir.str() + "/b", true, -1);
  ASSERT_EQ(rest.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rest.losses[i], full.losses[3 + i]) << "step " << 3 + i;
  EXPECT_THROW(test::make_session(recipe("[[strategy]]\nplugin = \"offload\"\ntrainable = true\n",
                                         dir.str() + "/c")),
               RecipeError);
}

TEST_F(OffloadOptimizerTest, StateLivesInFilesAndIsNotResident) {
  auto& acct = MemoryAccounting::instance();
  auto plain = test::make_session(recipe("", dir.str() + "/plain"));
  plain->train();
  const int64_t plain_state = plain->update().optimizer().state_bytes();
  plain.reset();
  const int64_t before = acct.snapshot().current[TF_MEM_OPTIMIZER];
  test::TempDir out;
  auto s = test::make_session(recipe(kOffload, out.str()));
  acct.reset_peaks();
  s->train();
  // Counted optimizer memory does not grow: the state is in the tier's files.
  EXPECT_LE(acct.snapshot().peak[TF_MEM_OPTIMIZER] - before, 0);
  int64_t file_bytes = 0;
  // (in the tier's private folder inside offload/, made with mkdtemp)
  for (const auto& e : std::filesystem::recursive_directory_iterator(s->env().run_dir + "/offload"))
    if (e.is_regular_file() && e.path().filename().string().rfind("optimizer-", 0) == 0)
      file_bytes += static_cast<int64_t>(e.file_size());
  EXPECT_EQ(file_bytes, plain_state);
}

TEST_F(OffloadOptimizerTest, ResumesExactlyFromACheckpoint) {
  auto run = [&](const std::string& out, bool resume, int64_t stop) {
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop;
    return test::make_session(recipe(kOffload, out), o)->train();
  };
  const TrainSummary full = run(dir.str() + "/a", false, -1);
  run(dir.str() + "/b", false, 3);
  const TrainSummary rest = run(dir.str() + "/b", true, -1);
  ASSERT_EQ(rest.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(rest.losses[i], full.losses[3 + i]) << "step " << 3 + i;
}

// A checkpoint streams the tier's state from its files to the checkpoint's,
// a parameter at a time (the gpt2-1.5b-offload recipe's 11.6 GiB of state
// in a 10 GiB budget): saving and resuming never hold the whole state, and
// the state file holds every slot of every trained parameter.
TEST_F(OffloadOptimizerTest, CheckpointsStreamTheStateThroughMemory) {
  auto& acct = MemoryAccounting::instance();
  test::TempDir out;
  auto s = test::make_session(recipe(kOffload, out.str()));
  s->train();
  int64_t state_bytes = 0, largest = 0;
  for (const Param& p : s->store().all())
    if (p.trainable) {
      state_bytes += 2 * p.numel() * 4;  // AdamW: two fp32 slots
      largest = std::max(largest, 2 * p.numel() * 4);
    }
  ASSERT_GT(state_bytes, 5 * largest) << "the test needs state spread over many parameters";
  const int64_t before = acct.snapshot().total_current;
  acct.reset_peaks();
  const std::string cp = s->save_checkpoint(s->step() + 1);
  EXPECT_LT(acct.snapshot().total_peak - before, state_bytes / 2)
      << "saving gathered the state in memory";
  const SafetensorsReader state(cp + "/state.safetensors");
  int64_t saved = 0;
  for (const std::string& n : state.names())
    if (n.find(".offload.") != std::string::npos)
      saved += c10::multiply_integers(state.shape(n)) * 4;
  EXPECT_EQ(saved, state_bytes);
  s.reset();

  SessionOptions o;
  o.resume = true;
  auto r = test::make_session(recipe(kOffload, out.str()), o);
  acct.reset_peaks();
  const int64_t loaded_before = acct.snapshot().total_current;
  ASSERT_TRUE(r->load_latest_checkpoint());
  EXPECT_LT(acct.snapshot().total_peak - loaded_before, state_bytes / 2)
      << "resuming gathered the state in memory";
}

// Activations on the disk tier: the inputs checkpointed stages keep go to
// files behind the forward pass and come back in backward: same gradients,
// fewer activation bytes resident, no files left over.
TEST_F(OffloadTest, CheckpointedInputsOnDiskGiveTheSameGradientsWithLessMemory) {
  std::string base =
      test::tiny_recipe(corpus, dir.str(), "", "[[strategy]]\nplugin = \"checkpoint\"\n");
  base.replace(base.find("n_layer = 2"), 11, "n_layer = 8");
  base.replace(base.find("n_embd = 32"), 11, "n_embd = 64");
  base.replace(base.find("seq_len = 32"), 12, "seq_len = 64");
  auto& acct = MemoryAccounting::instance();
  auto measure = [&](Session& s, const Batcher::Batch& b) {
    s.update().zero_grad();
    const int64_t before = acct.snapshot().current[TF_MEM_ACTIVATIONS];
    acct.reset_peaks();
    s.executor().run_pass(b.tokens, b.targets, true, 1.0);
    return acct.snapshot().peak[TF_MEM_ACTIVATIONS] - before;
  };
  auto ckpt = test::make_session(base);
  auto off = test::make_session(
      base + "[[strategy]]\nplugin = \"offload\"\nparams = \"none\"\nactivations = \"disk\"\n");
  for (int step = 0; step < 2; ++step) {
    auto b = ckpt->data().batcher().next();
    off->data().batcher().next();
    const int64_t peak_ckpt = measure(*ckpt, b), peak_off = measure(*off, b);
    for (Param* p : ckpt->store().trainable())
      EXPECT_TRUE(at::equal(p->value.grad(), off->store().get(p->name).value.grad())) << p->name;
    // 8 block inputs of [4, 64, 64] fp32 (64 KiB each) go to disk; one write
    // may be in flight and the last block's input is needed right away.
    // (Activations by category: counted on the CPU only, test_support.hpp.)
    if (test::categories_not_counted_here().empty()) {
      EXPECT_LE(peak_off, peak_ckpt - 6 * 4 * 64 * 64 * 4) << peak_ckpt << " vs " << peak_off;
    }
    ckpt->update().optimizer_step();
    off->update().optimizer_step();
  }
  int left = 0;
  for (const auto& e : std::filesystem::directory_iterator(off->env().run_dir + "/offload"))
    left += e.path().filename().string().rfind("activation-", 0) == 0;
  EXPECT_EQ(left, 0);
  // Without checkpointing there is nothing of this kind to move.
  EXPECT_THROW(
      test::make_session(test::tiny_recipe(corpus, dir.str(), "",
                                           "[[strategy]]\nplugin = \"offload\"\nparams = \"none\"\n"
                                           "activations = \"disk\"\n")),
      RecipeError);
}

TEST_F(OffloadTest, NothingToOffloadIsARecipeError) {
  std::string r = test::tiny_recipe(corpus, dir.str(), "", "[[strategy]]\nplugin = \"offload\"\n");
  EXPECT_THROW(test::make_session(r), RecipeError);
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

std::string expert_recipe(const test::TempDir& dir, const std::string& strategies) {
  std::string r = test::tiny_recipe(
      test::write_corpus(dir), dir.str(), "",
      "[[strategy]]\nplugin = \"quantize\"\nformat = \"nf4\"\n[[strategy]]\nplugin = "
      "\"lora\"\ntargets = [\"q\", \"v\", \"gate\", \"down\"]\nrank = 4\n" +
          strategies);
  const auto begin = r.find("[model]"), end = r.find("[data]");
  r.replace(begin, end - begin, "[model]\n" + test::many_experts_model(dir) + "\n");
  r.replace(r.find("seq_len = 32"), 12, "seq_len = 8");
  r.replace(r.find("batch_size = 4"), 14, "batch_size = 2");
  r.replace(r.find("eval_batches = 1"), 16, "eval_batches = 0");  // a step's reads are its own
  return r;
}

// Offloaded experts (TF_PARAM_EXPERT, ABI 1.15) stay in the disk tier
// through their block's event and come in one by one when the model fetches
// them for the tokens routed to them: the same losses and gradients as in
// memory (also recomputed), and fewer experts read than a block holds.
TEST(OffloadExperts, OnlyRoutedExpertsComeInAndTheResultIsTheSame) {
  for (const std::string extra : {"", "[[strategy]]\nplugin = \"checkpoint\"\n"}) {
    test::TempDir dir;
    auto plain = test::make_session(expert_recipe(dir, extra));
    test::TempDir dir2;
    auto off = test::make_session(
        expert_recipe(dir2, "[[strategy]]\nplugin = \"offload\"\nparams = \"disk\"\n" + extra));
    const Param& expert = off->store().get("model.layers.1.block_sparse_moe.experts.7.w2.weight");
    EXPECT_TRUE(expert.flags & TF_PARAM_EXPERT);
    EXPECT_EQ(expert.residency, TF_TIER_DISK);
    EXPECT_EQ(expert.value.numel(), 0);
    for (int step = 0; step < 2; ++step) {
      auto b = plain->data().batcher().next();
      off->data().batcher().next();
      plain->update().zero_grad();
      off->update().zero_grad();
      EXPECT_EQ(plain->executor().run_pass(b.tokens, b.targets, true, 1.0).loss,
                off->executor().run_pass(b.tokens, b.targets, true, 1.0).loss);
      for (Param* p : plain->store().trainable()) {
        const at::Tensor& g = off->store().get(p->name).value.grad();
        ASSERT_EQ(p->value.grad().defined(), g.defined()) << p->name;
        if (g.defined()) {
          EXPECT_TRUE(at::equal(p->value.grad(), g)) << p->name;
        }
      }
      EXPECT_EQ(expert.value.numel(), 0) << "an expert stayed resident after its block";
      plain->update().optimizer_step();
      off->update().optimizer_step();
    }
    // The step's metrics count the experts read: forward and backward (and
    // recompute) each read what the 16 tokens chose, never all 3 x 16 x 3.
    const TrainSummary sum = off->train();
    std::ifstream in(sum.metrics_path);
    int lines = 0;
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json m = nlohmann::json::parse(line);
      if (!m.contains("offload.expert_loads")) continue;
      ++lines;
      const double loads = m["offload.expert_loads"].get<double>();
      EXPECT_GT(loads, 0);
      // per pass at most 16 tokens' experts x 3 weights x 3 blocks; passes: forward, backward
      // (+ recompute)
      EXPECT_LT(loads, (extra.empty() ? 2 : 3) * 16 * 3 * 3);
      EXPECT_GT(m["offload.expert_mib"].get<double>(), 0);
    }
    EXPECT_GT(lines, 0);
  }
}

// The plan's reads of routed experts (ABI 1.17's routed_share): a pass of 16
// tokens, each routed to one of 16 experts, uses 1 - (15/16)^16 = 64% of a
// layer's expert weights if each token's choice is even and independent,
// each read at every use (forward and backward, and a recompute). Tokens
// drawn at random read close to that (eight steps' mean: 82-88% of it when
// measured; a random router is not quite even, as the hidden states share
// a direction, attention's average), never past it, and far more than a
// plan that counted only the forward's reads, far fewer than one that read
// every expert; words, whose repeated tokens route alike, read fewer still
// (71-76%), never more than the plan's bound (T share of each, at most
// all). The step's cost has the expected reads whole (stage prefetch hides
// none of them, and the read-ahead of the chosen experts is not credited).
TEST(OffloadExperts, ThePlanCountsWhatTheRoutedExpertsCostTheTier) {
  for (const bool words : {false, true})
    for (const std::string extra : {"", "[[strategy]]\nplugin = \"checkpoint\"\n"}) {
      test::TempDir dir;
      std::string text =
          expert_recipe(dir, "[[strategy]]\nplugin = \"offload\"\nparams = \"disk\"\n" + extra);
      text.replace(text.find("steps = 4"), 9, "steps = 8");
      if (!words) {
        std::mt19937 rng(11);
        std::string letters;
        for (int i = 0; i < 20000; ++i) letters += static_cast<char>('!' + rng() % 94);
        const std::string corpus = test::write_file(dir, "letters.txt", letters + "\n");
        const size_t at = text.find("corpus = \"") + 10;
        text.replace(at, text.find('"', at) - at, corpus);
      }
      SessionOptions dry;
      dry.dry_run = true;
      auto planned = test::make_session(text, dry);
      const MemoryPlan plan = plan_memory(planned->parts());
      const double uses = extra.empty() ? 2 : 3;
      const double used = 1 - std::pow(15.0 / 16.0, 16);
      const double weights = 3 * 16 * 3;  // 3 blocks of 16 experts' gate, up and down
      ASSERT_EQ(plan.routed.weights, weights);
      EXPECT_NEAR(plan.routed.used_per_pass, weights * used, 1e-9);
      EXPECT_EQ(plan.routed.most_used_per_pass, weights);  // 16 tokens x 1/16 each
      EXPECT_NEAR(plan.routed.reads_per_pass, uses * weights * used, 1e-9);
      EXPECT_NEAR(plan.routed.bytes_per_pass, uses * static_cast<double>(plan.routed.bytes) * used,
                  1e-6 * static_cast<double>(plan.routed.bytes));

      const TrainSummary sum = test::make_session(text)->train();
      std::ifstream in(sum.metrics_path);
      double loads = 0, mib = 0;
      int steps = 0;
      for (std::string line; std::getline(in, line);) {
        const nlohmann::json m = nlohmann::json::parse(line);
        if (!m.contains("offload.expert_loads")) continue;
        ++steps;
        loads += m["offload.expert_loads"].get<double>();
        mib += m["offload.expert_mib"].get<double>();
      }
      ASSERT_EQ(steps, 8);
      loads /= steps;
      mib /= steps;
      const double bytes_per_read = static_cast<double>(plan.routed.bytes) / weights;
      EXPECT_NEAR(mib * (1 << 20) / loads, bytes_per_read, 1e-6 * bytes_per_read);
      if (words) {
        EXPECT_LE(loads, uses * plan.routed.most_used_per_pass);
        EXPECT_LT(loads, plan.routed.reads_per_pass) << "words route alike: measured " << loads
                                                     << ", planned " << plan.routed.reads_per_pass;
      } else {
        EXPECT_GT(loads, 0.7 * plan.routed.reads_per_pass)
            << "measured " << loads << " expert reads a step, planned "
            << plan.routed.reads_per_pass;
        EXPECT_LT(loads, 1.05 * plan.routed.reads_per_pass)
            << "measured " << loads << " expert reads a step, planned "
            << plan.routed.reads_per_pass;
      }

      // The cost model, with matmuls slow enough that prefetch hides every
      // stage's own weights: what is left of the tier's traffic is the
      // experts' expected reads, at the disk's rate.
      MachineRates rates;
      rates.disk_read_warm = rates.disk_read_cold = rates.disk_write = 1e9;
      rates.ram_available = int64_t{1} << 40;
      CostOptions options;
      options.prefetch = 2;
      const StepCost cost = predict_step_cost(planned->parts(), plan, rates, options);
      EXPECT_NEAR(cost.transfer, plan.routed.bytes_per_pass / 1e9, 1e-9 * cost.transfer + 1e-15);
    }
}

// Once the router has chosen, the model names the weights it fetches next
// (expect_weights, ABI 1.17) and offload reads them ahead on its worker; in
// backward it reads the forward's experts ahead, last first. The same
// losses and the same reads as reading each when fetched, with and without
// recompute, and the reads ahead counted (offload.expert_read_ahead).
TEST(OffloadExperts, ReadingExpertsAheadGivesTheSameRun) {
  for (const std::string extra : {"", "[[strategy]]\nplugin = \"checkpoint\"\n"}) {
    std::vector<std::vector<nlohmann::json>> runs;
    for (const char* ahead : {"0", "6", "1"}) {
      test::TempDir dir;
      const std::string text = expert_recipe(
          dir, "[[strategy]]\nplugin = \"offload\"\nparams = \"disk\"\nexpert_prefetch = " +
                   std::string(ahead) + "\n" + extra);
      const TrainSummary sum = test::make_session(text)->train();
      std::ifstream in(sum.metrics_path);
      runs.emplace_back();
      for (std::string line; std::getline(in, line);) {
        const nlohmann::json m = nlohmann::json::parse(line);
        if (m.contains("offload.expert_loads")) runs.back().push_back(m);
      }
      ASSERT_EQ(runs.back().size(), 4u) << ahead;
    }
    for (size_t step = 0; step < 4; ++step) {
      const nlohmann::json& each = runs[0][step];
      EXPECT_EQ(each["offload.expert_read_ahead"].get<double>(), 0);
      for (size_t r = 1; r < runs.size(); ++r) {
        const nlohmann::json& m = runs[r][step];
        EXPECT_EQ(m["loss"].get<double>(), each["loss"].get<double>()) << r << " step " << step;
        EXPECT_EQ(m["offload.expert_loads"], each["offload.expert_loads"]);
        EXPECT_GT(m["offload.expert_read_ahead"].get<double>(), 0) << r << " step " << step;
        EXPECT_LE(m["offload.expert_read_ahead"].get<double>(),
                  m["offload.expert_loads"].get<double>());
      }
    }
  }
}

}  // namespace
}  // namespace tightfit
