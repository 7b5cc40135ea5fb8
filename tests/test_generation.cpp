// Generation with the LLaMA family's key/value cache gives what recomputing
// the whole context gives, token for token, also with a sliding window
// shorter than the context and with Qwen3's per-head norms; it stops at the
// end-of-sequence tokens it is given.
#include <gtest/gtest.h>

#include <cstdlib>

#include "test_support.hpp"

namespace tightfit {
namespace {

struct Case {
  const char* name;
  const char* peer;  // hf_parity.py family whose config.json shapes the model ("" = preset)
};

class KvCache : public ::testing::TestWithParam<Case> {};

TEST_P(KvCache, GreedyTokensEqualRecomputing) {
  test::TempDir dir;
  std::string model = "plugin = \"llama\"\npreset = \"tiny\"\nvocab_size = 256\n";
  if (*GetParam().peer) {
    const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                            "/tests/peers/hf_parity.py " + GetParam().peer + " " + dir.str();
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    model = "plugin = \"llama\"\nconfig = \"" + dir.str() + "\"\nweights = \"" + dir.str() +
            "/model.safetensors\"\n";
  }
  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str());
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin, "[model]\n" + model + "\n");
  recipe.replace(recipe.find("seq_len = 32"), 12, "seq_len = 64");
  SessionOptions so;
  so.skip_data = true;
  auto s = test::make_session(recipe, so);
  // 40 new tokens after a 12-token prompt: past the window of 5 (mistral).
  const std::string cached = s->generate("The cat sat.", 40, 1, 0.0, 1, 1.0, true);
  const std::string full = s->generate("The cat sat.", 40, 1, 0.0, 1, 1.0, false);
  EXPECT_EQ(cached.size(), 40u);  // bytes: one a token
  EXPECT_EQ(cached, full);
  // Stopping: the first greedy token as the stop token leaves nothing.
  const std::vector<int64_t> stop{static_cast<unsigned char>(full[0])};
  EXPECT_EQ(s->generate("The cat sat.", 40, 1, 0.0, 1, 1.0, true, stop), "");
  EXPECT_EQ(s->generate("The cat sat.", 40, 1, 0.0, 1, 1.0, false, stop), "");
}

INSTANTIATE_TEST_SUITE_P(Families, KvCache,
                         ::testing::Values(Case{"llama", ""}, Case{"mistral_window", "mistral"},
                                           Case{"qwen3", "qwen3"}, Case{"qwen2", "qwen2"},
                                           Case{"gemma", "gemma"}, Case{"gemma2", "gemma2"},
                                           Case{"gemma3_text", "gemma3_text"}, Case{"phi3", "phi3"},
                                           Case{"mixtral", "mixtral"},
                                           Case{"qwen2_moe", "qwen2_moe"},
                                           Case{"qwen3_moe", "qwen3_moe"}, Case{"olmoe", "olmoe"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tightfit
