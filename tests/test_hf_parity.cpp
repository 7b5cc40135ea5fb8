// Models against Hugging Face transformers on the same random weights:
// logits (1e-4 absolute), loss (1e-5) and every parameter's gradient (1e-4
// relative) after one backward.
#include <gtest/gtest.h>

#include <cstdlib>

#include "safetensors.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

struct Family {
  const char* name;
  std::string model_table;  // replaces the tiny recipe's GPT-2 model keys
  int expected_params;
};

class HfParity : public ::testing::TestWithParam<Family> {};

TEST_P(HfParity, MatchesTransformersLogitsLossAndGradients) {
  const Family& f = GetParam();
  test::TempDir dir;
  const std::string python = std::string(TIGHTFIT_SOURCE_DIR) + "/.venv/bin/python";
  const std::string script = std::string(TIGHTFIT_SOURCE_DIR) + "/tests/peers/hf_parity.py";
  ASSERT_EQ(std::system((python + " " + script + " " + f.name + " " + dir.str()).c_str()), 0)
      << "the Python peer failed; scripts/setup installs torch and transformers into .venv";
  const SafetensorsFile ref = read_safetensors(dir.str() + "/reference.safetensors");

  std::string table = f.model_table;
  if (const auto at = table.find("@DIR@"); at != std::string::npos) table.replace(at, 5, dir.str());
  std::string recipe = test::tiny_recipe(test::write_corpus(dir), dir.str());
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(begin, end - begin,
                 "[model]\n" + table + "weights = \"" + dir.str() + "/model.safetensors\"\n\n");
  auto s = test::make_session(recipe);
  const at::Tensor tokens = ref.tensors.at("tokens"), targets = ref.tensors.at("targets");
  {
    at::NoGradGuard no_grad;
    const at::Tensor logits = s->forward_logits(tokens, /*training=*/false);
    const double err = (logits - ref.tensors.at("logits")).abs().max().item<double>();
    EXPECT_LE(err, 1e-4);
    RecordProperty("max_logit_error", std::to_string(err));
  }
  const PassResult r = s->run_pass(tokens, targets, true, 1.0);
  EXPECT_NEAR(r.loss, ref.tensors.at("loss").item<double>(), 1e-5);
  int compared = 0;
  double worst = 0;
  for (const Param& p : s->store().all()) {
    at::Tensor expected = ref.tensors.at("grad." + p.name);
    if (p.flags & TF_PARAM_HF_TRANSPOSED) expected = expected.t();
    const at::Tensor& g = p.value.grad();
    ASSERT_TRUE(g.defined()) << p.name;
    const double rel = (g - expected).abs().max().item<double>() / (expected.abs().max().item<double>() + 1e-12);
    EXPECT_LE(rel, 1e-4) << p.name;
    worst = std::max(worst, rel);
    ++compared;
  }
  RecordProperty("max_grad_rel_error", std::to_string(worst));
  EXPECT_EQ(compared, f.expected_params);
}

INSTANTIATE_TEST_SUITE_P(
    Families, HfParity,
    ::testing::Values(
        Family{"gpt2", "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 2\nn_positions = 64\n",
               2 * 12 + 4},
        // Grouped-query attention: 4 query heads share 2 key/value heads.
        Family{"llama", "plugin = \"llama\"\nconfig = \"@DIR@\"\n", 2 * 9 + 3}),
    [](const ::testing::TestParamInfo<Family>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tightfit
