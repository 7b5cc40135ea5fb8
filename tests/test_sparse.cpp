// sparse: skipped middle blocks are never allocated, loaded or run; frozen
// ones run without training; LISA trains k drawn blocks per interval; all
// blocks trained is the plain run; it composes with LoRA and quantize.
#include <gtest/gtest.h>

#include <set>

#include "test_support.hpp"

namespace tightfit {
namespace {

class SparseTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  // A tiny LLaMA with 4 blocks (stages 1..4); `model_extra` goes into [model].
  std::string recipe(const std::string& strategies, const std::string& model_extra = "") const {
    std::string r = test::tiny_recipe(corpus, dir.str(), "", strategies);
    const auto begin = r.find("[model]"), end = r.find("[data]");
    r.replace(begin, end - begin,
              "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 64\n"
              "n_head = 4\nn_kv_head = 2\nintermediate_size = 128\nmax_positions = 64\n" +
                  model_extra + "\n");
    return r;
  }
  static std::string sparse(const std::string& keys) {
    return "[[strategy]]\nplugin = \"sparse\"\n" + keys + "\n";
  }
};

void train(Session& s, int steps) {
  for (int i = 0; i < steps; ++i) {
    s.step_begin(i);
    s.update().zero_grad();
    auto b = s.data().next_batch();
    s.executor().run_pass(b.tokens, b.targets, true, 1.0);
    ASSERT_EQ(s.update().optimizer_step(), TF_OK);
  }
}

std::map<std::string, at::Tensor> weights(Session& s) {
  std::map<std::string, at::Tensor> out;
  for (const Param& p : s.store().all()) out[p.name] = p.value.detach().clone();
  return out;
}

bool in_block(const std::string& name, int block) {
  return name.find("layers." + std::to_string(block) + ".") != std::string::npos;
}

TEST_F(SparseTest, AllBlocksTrainedIsThePlainRun) {
  auto plain = test::make_session(recipe(""));
  train(*plain, 3);
  for (const char* keys : {"first = 4\nmiddle = \"skip\"", "first = 2\nlast = 2",
                           "last = 4\nmiddle = \"lisa\"\nk = 0"}) {
    SCOPED_TRACE(keys);
    auto s = test::make_session(recipe(sparse(keys)));
    train(*s, 3);
    for (const auto& [name, w] : weights(*plain)) EXPECT_TRUE(at::equal(weights(*s).at(name), w));
  }
}

TEST_F(SparseTest, SkippedBlocksHoldNoWeightsAndAreNotRun) {
  auto plain = test::make_session(recipe(""));
  auto s = test::make_session(recipe(sparse("first = 1\nlast = 1\nmiddle = \"skip\"")));
  int64_t skipped_bytes = 0;
  for (const Param& p : plain->store().all())
    if (in_block(p.name, 1) || in_block(p.name, 2)) skipped_bytes += p.value.nbytes();
  for (const Param& p : s->store().all()) {
    const bool middle = in_block(p.name, 1) || in_block(p.name, 2);
    EXPECT_EQ(p.absent, middle) << p.name;
    if (middle) {
      EXPECT_EQ(p.value.numel(), 0) << p.name;
      EXPECT_FALSE(p.trainable) << p.name;
    }
  }
  EXPECT_GT(skipped_bytes, 0);
  EXPECT_EQ(plain->store().stored_bytes() - s->store().stored_bytes(), skipped_bytes);
  EXPECT_TRUE(s->executor().stages()[2].skip && s->executor().stages()[3].skip);
  // The blocks kept start from the numbers the plain run draws, and the model
  // is theirs with the middle blocks taken out: the plain model with them
  // skipped computes the same logits.
  for (size_t i : {2u, 3u}) plain->executor().stages()[i].skip = true;
  const at::Tensor tokens = at::randint(0, 256, {2, 16}, at::kLong);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(s->executor().forward_logits(tokens, false),
                        plain->executor().forward_logits(tokens, false)));
  // A skipped block cannot be brought back without its weights.
  EXPECT_NE(s->host_api()->stage_set_skip(s->plugins().model.ctx.get(), 2, 0), TF_OK);
  EXPECT_THROW(s->export_hf((dir.path() / "hf").string()), std::runtime_error);
}

TEST_F(SparseTest, FrozenMiddleRunsButDoesNotTrain) {
  auto s = test::make_session(recipe(sparse("first = 1\nlast = 1\nmiddle = \"frozen\"")));
  const auto before = weights(*s);
  train(*s, 3);
  const auto after = weights(*s);
  for (const auto& [name, w] : before) {
    const bool middle = in_block(name, 1) || in_block(name, 2);
    EXPECT_EQ(at::equal(after.at(name), w), middle) << name;
  }
  for (const auto& [k, t] : s->update().optimizer().state())
    EXPECT_FALSE(in_block(k, 1) || in_block(k, 2)) << k << " has optimizer state";
}

TEST_F(SparseTest, LisaTrainsKDrawnBlocksPerInterval) {
  auto s = test::make_session(recipe(sparse("middle = \"lisa\"\nk = 1\ninterval = 2")));
  auto twin = test::make_session(recipe(sparse("middle = \"lisa\"\nk = 1\ninterval = 2")));
  std::set<int> drawn;
  int previous = -1;
  for (int step = 0; step < 12; ++step) {
    s->step_begin(step);
    twin->step_begin(step);
    std::vector<int> on;
    for (int b = 0; b < 4; ++b)
      if (s->store().get("model.layers." + std::to_string(b) + ".mlp.up_proj.weight").trainable)
        on.push_back(b);
    ASSERT_EQ(on.size(), 1u) << "step " << step;
    EXPECT_TRUE(twin->store()
                    .get("model.layers." + std::to_string(on[0]) + ".mlp.up_proj.weight")
                    .trainable)
        << "the draw depends only on seed and step";
    if (step % 2 == 1) {
      EXPECT_EQ(on[0], previous) << "redrawn inside an interval";
    }
    previous = on[0];
    drawn.insert(on[0]);
    EXPECT_TRUE(s->store().get("model.embed_tokens.weight").trainable);
    EXPECT_TRUE(s->store().get("lm_head.weight").trainable);
  }
  EXPECT_GE(drawn.size(), 2u);
}

// QLoRA with the NF4 base offloaded to disk, on the first and last blocks of
// a model loaded from Hugging Face weights: the middle ones are never read
// from the file and get no adapters.
TEST_F(SparseTest, ComposesWithQloraAndSkipsLoadingTheMiddle) {
  const std::string hf = (dir.path() / "hf").string();
  test::make_session(recipe(""), {.skip_data = true})->export_hf(hf);
  const std::string stack = sparse("first = 1\nlast = 1\nmiddle = \"skip\"") +
                            "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"v\"]\nrank = 4\n"
                            "[[strategy]]\nplugin = \"quantize\"\nformat = \"nf4\"\n"
                            "[[strategy]]\nplugin = \"offload\"\nparams = \"disk\"\n";
  auto s = test::make_session(recipe(stack, "weights = \"" + hf + "\"\n"));
  for (const Param& p : s->store().all()) {
    const bool middle = in_block(p.name, 1) || in_block(p.name, 2);
    if (middle) {
      EXPECT_TRUE(p.absent) << p.name;
      EXPECT_EQ(p.flags & TF_PARAM_ADAPTER, 0u) << p.name << ": an adapter in a skipped block";
    }
  }
  EXPECT_NE(s->store().find("model.layers.0.self_attn.q_proj.lora_A.weight"), nullptr);
  EXPECT_NE(s->store().find("model.layers.3.self_attn.q_proj.lora_A.weight"), nullptr);
  const Param& k0 = s->store().get("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k0.format, TF_FORMAT_NF4);
  EXPECT_EQ(k0.residency, TF_TIER_DISK);
  std::vector<double> losses;
  for (int i = 0; i < 6; ++i) {
    s->update().zero_grad();
    auto b = s->data().next_batch();
    losses.push_back(s->executor().run_pass(b.tokens, b.targets, true, 1.0).loss);
    ASSERT_EQ(s->update().optimizer_step(), TF_OK);
  }
  EXPECT_TRUE(std::isfinite(losses.back()));
}

TEST_F(SparseTest, ExportingSkippedBlocksIsRefusedBeforeTraining) {
  EXPECT_THROW(test::make_session(recipe(sparse("first = 1\nlast = 1\nmiddle = \"skip\"") +
                                         "[save]\nhf = true\n")),
               RecipeError);
  EXPECT_NO_THROW(test::make_session(
      recipe(sparse("first = 1\nlast = 1\nmiddle = \"frozen\"") + "[save]\nhf = true\n")));
}

TEST_F(SparseTest, BadKeysAreRecipeErrors) {
  for (const char* keys : {"first = 3\nlast = 2", "middle = \"lisa\"\nk = 5",
                           "middle = \"frozen\"\ninterval = 3", "middle = \"sometimes\""}) {
    SCOPED_TRACE(keys);
    EXPECT_THROW(test::make_session(recipe(sparse(keys))), RecipeError);
  }
}

}  // namespace
}  // namespace tightfit
