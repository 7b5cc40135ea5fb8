// GPT-2 against Hugging Face transformers on the same random weights:
// logits, loss and every parameter's gradient.
#include <gtest/gtest.h>

#include <cstdlib>

#include "safetensors.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

TEST(Gpt2Parity, MatchesTransformersLogitsLossAndGradients) {
  test::TempDir dir;
  const std::string python = std::string(TIGHTFIT_SOURCE_DIR) + "/.venv/bin/python";
  const std::string script = std::string(TIGHTFIT_SOURCE_DIR) + "/tests/peers/gpt2_parity.py";
  ASSERT_EQ(std::system((python + " " + script + " " + dir.str()).c_str()), 0)
      << "the Python peer failed; scripts/setup installs torch and transformers into .venv";
  const SafetensorsFile ref = read_safetensors(dir.str() + "/reference.safetensors");

  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str(),
                                         "weights = \"" + dir.str() + "/model.safetensors\"\n");
  auto s = test::make_session(recipe);
  const at::Tensor tokens = ref.tensors.at("tokens"), targets = ref.tensors.at("targets");
  {
    at::NoGradGuard no_grad;
    const at::Tensor logits = s->forward_logits(tokens, /*training=*/false);
    const at::Tensor expected = ref.tensors.at("logits");
    EXPECT_LE((logits - expected).abs().max().item<double>(), 1e-4);
  }
  const PassResult r = s->run_pass(tokens, targets, true, 1.0);
  EXPECT_NEAR(r.loss, ref.tensors.at("loss").item<double>(), 1e-5);
  int compared = 0;
  for (const Param& p : s->store().all()) {
    at::Tensor expected = ref.tensors.at("grad." + p.name);
    if (p.flags & TF_PARAM_HF_TRANSPOSED) expected = expected.t();
    const at::Tensor& g = p.value.grad();
    ASSERT_TRUE(g.defined()) << p.name;
    const double scale = expected.abs().max().item<double>() + 1e-12;
    EXPECT_LE((g - expected).abs().max().item<double>() / scale, 1e-4) << p.name;
    ++compared;
  }
  EXPECT_EQ(compared, 2 * 12 + 4);
}

}  // namespace
}  // namespace tightfit
