// RWKV's recurrent decoding equals the parallel (chunked) forward.
#include <gtest/gtest.h>

#include "test_support.hpp"

namespace tightfit {
namespace {

class RwkvTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::unique_ptr<Session> session = [this] {
    std::string r = test::tiny_recipe(test::write_corpus(dir), dir.str());
    const auto begin = r.find("[model]"), end = r.find("[data]");
    r.replace(begin, end - begin,
              "[model]\nplugin = \"rwkv\"\npreset = \"custom\"\nn_layer = 3\nn_embd = "
              "32\nwkv_chunk = 4\n\n");
    auto s = test::make_session(r);
    s->update().optimizer().set_lr(3e-3);
    for (int i = 0; i < 5; ++i) {  // move off the zero-initialized projections
      s->update().zero_grad();
      auto b = s->data().batcher().next();
      s->executor().run_pass(b.tokens, b.targets, true, 1.0);
      s->update().optimizer_step();
    }
    return s;
  }();
};

TEST_F(RwkvTest, ChunkSizeDoesNotChangeTheResult) {
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, 256, {2, 23}, at::kLong);
  const at::Tensor a = session->executor().forward_logits(tokens, false);
  Recipe r = session->recipe();
  r.apply_override("model.wkv_chunk=23");
  Session whole(r, test::registry());
  for (Param& p : whole.store().all()) p.value.detach().copy_(session->store().get(p.name).value);
  EXPECT_LE((whole.executor().forward_logits(tokens, false) - a).abs().max().item<double>(), 1e-5);
}

TEST_F(RwkvTest, DecodingInPiecesGivesTheParallelLogits) {
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::randint(0, 256, {2, 15}, at::kLong);
  const at::Tensor expected = session->executor().forward_logits(tokens, false);
  PluginInstance& m = session->plugins().model;
  const tf_model_vtable* vt = m.plugin->model();
  ASSERT_NE(vt->decode, nullptr);
  void* cache = nullptr;
  std::vector<at::Tensor> pieces;
  for (auto [a, b] : {std::pair{0, 10}, {10, 11}, {11, 12}, {12, 15}}) {
    at::Tensor x = tokens.slice(1, a, b).contiguous();
    tf_tensor out = nullptr;
    ASSERT_EQ(vt->decode(m.state, m.ctx.get(), &cache, reinterpret_cast<tf_tensor>(&x), &out),
              TF_OK);
    pieces.push_back(*reinterpret_cast<at::Tensor*>(out));
    delete reinterpret_cast<at::Tensor*>(out);
  }
  vt->release_cache(m.state, cache);
  EXPECT_LE((at::cat(pieces, 1) - expected).abs().max().item<double>(), 1e-5);
}

TEST_F(RwkvTest, RecurrentGenerationMatchesFullRecompute) {
  // Prompt + generated tokens stay inside seq_len, so both see the whole context.
  const std::string recurrent =
      session->generate("the cat", 20, 1, 0.0, 1, 1.0, /*use_cache=*/true);
  const std::string full = session->generate("the cat", 20, 1, 0.0, 1, 1.0, /*use_cache=*/false);
  EXPECT_EQ(recurrent.size(), 20u);
  EXPECT_EQ(recurrent, full);
}

}  // namespace
}  // namespace tightfit
