// Disk offload of frozen weights: exact (same gradients and losses as keeping
// them in memory), and at most prefetch + 1 stages' weights resident.
#include <gtest/gtest.h>

#include "test_support.hpp"

namespace tightfit {
namespace {

class OffloadTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  std::string recipe(const std::string& strategies) const {
    std::string r = test::tiny_recipe(corpus, dir.str(), "",
                                      "[[strategy]]\nplugin = \"lora\"\ntargets = [\"c_attn\", \"c_fc\"]\nrank = 4\n" + strategies);
    r.replace(r.find("n_layer = 2"), 11, "n_layer = 6");
    r.replace(r.find("n_embd = 32"), 11, "n_embd = 64");
    return r;
  }
};

TEST_F(OffloadTest, SameGradientsAsInMemoryAlsoWithCheckpointing) {
  for (const std::string extra : {"", "[[strategy]]\nplugin = \"checkpoint\"\n"}) {
    auto plain = test::make_session(recipe(extra));
    auto off = test::make_session(recipe("[[strategy]]\nplugin = \"offload\"\nprefetch = 1\n" + extra));
    EXPECT_EQ(off->store().get("transformer.h.3.mlp.c_fc.weight").residency, TF_TIER_DISK);
    EXPECT_EQ(off->store().get("transformer.h.3.mlp.c_fc.weight").value.numel(), 0);
    for (int step = 0; step < 3; ++step) {
      auto b = plain->batcher().next();
      off->batcher().next();
      plain->zero_grad();
      off->zero_grad();
      const double lp = plain->run_pass(b.tokens, b.targets, true, 1.0).loss;
      const double lo = off->run_pass(b.tokens, b.targets, true, 1.0).loss;
      EXPECT_EQ(lp, lo) << "step " << step;
      for (Param* p : plain->store().trainable())
        EXPECT_TRUE(at::equal(p->value.grad(), off->store().get(p->name).value.grad())) << p->name;
      plain->optimizer_step();
      off->optimizer_step();
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
    auto s = test::make_session(recipe("[[strategy]]\nplugin = \"offload\"\nprefetch = " + std::to_string(prefetch) + "\n"));
    const int64_t resident_base = acct.snapshot().current[TF_MEM_WEIGHTS] - before;
    acct.reset_peaks();
    auto b = s->batcher().next();
    s->run_pass(b.tokens, b.targets, true, 1.0);
    const int64_t peak = acct.snapshot().peak[TF_MEM_WEIGHTS] - before - resident_base;
    // (slack of a tenth of a block for small buffers counted as weights while a stage is read)
    EXPECT_LE(peak, (prefetch + 1) * block_bytes + block_bytes / 10) << "prefetch " << prefetch;
    if (prefetch <= 1) {  // 6 blocks: 1 or 2 resident
      EXPECT_LT(peak, offloadable / 2);
    }
  }
}

TEST_F(OffloadTest, NothingToOffloadIsARecipeError) {
  std::string r = test::tiny_recipe(corpus, dir.str(), "", "[[strategy]]\nplugin = \"offload\"\n");
  EXPECT_THROW(test::make_session(r), RecipeError);
}

}  // namespace
}  // namespace tightfit
