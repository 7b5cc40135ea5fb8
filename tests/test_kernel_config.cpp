// The kernel's recipe tables read once into structs (kernel_config.hpp):
// every key has its field, in the keys' order, and a recipe's values arrive
// typed (sizes in bytes, lists as lists, defaults where the recipe is silent).
#include <gtest/gtest.h>

#include "kernel_config.hpp"
#include "kernel_keys.hpp"

namespace tightfit {
namespace {

std::vector<std::string> names(const std::vector<KeySpec>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(k.name);
  return out;
}

TEST(KernelConfig, FieldsAreTheKeys) {
  EXPECT_EQ(run_config_fields(), names(run_keys()));
  EXPECT_EQ(data_config_fields(), names(data_keys()));
  EXPECT_EQ(optimizer_config_fields(), names(optimizer_keys()));
  EXPECT_EQ(save_config_fields(), names(save_keys()));
}

TEST(KernelConfig, ARecipesValuesArriveTyped) {
  const Recipe r = Recipe::parse(R"([run]
memory_budget = "1.5GiB"
steps = 7
plugin_paths = ["a", "b"]
debug_nan_at_steps = [2, 5]
[data]
packing = true
val_fraction = 0.25
[optimizer]
name = "sgd"
[save]
hf = true
)",
                                 "typed.toml");
  const RunConfig run = read_run_config(r.validate(r.table("run"), "[run]", run_keys()));
  EXPECT_EQ(run.memory_budget, int64_t{3} << 29);
  EXPECT_EQ(run.steps, 7);
  EXPECT_EQ(run.plugin_paths, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(run.debug_nan_at_steps, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(run.log_every, 10);  // the default
  EXPECT_EQ(run.on_non_finite, "skip");
  const DataConfig data = read_data_config(r.validate(r.table("data"), "[data]", data_keys()));
  EXPECT_TRUE(data.packing);
  EXPECT_EQ(data.val_fraction, 0.25);
  EXPECT_EQ(data.seq_len, 128);
  const OptimizerConfig opt =
      read_optimizer_config(r.validate(r.table("optimizer"), "[optimizer]", optimizer_keys()));
  EXPECT_EQ(opt.name, "sgd");
  EXPECT_EQ(opt.grad_clip, 1.0);
  const SaveConfig save = read_save_config(r.validate(r.table("save"), "[save]", save_keys()));
  EXPECT_TRUE(save.hf);
  EXPECT_TRUE(save.final);
  EXPECT_FALSE(save.adapter);
}

}  // namespace
}  // namespace tightfit
