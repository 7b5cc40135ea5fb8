// The tests' tiny recipe with a GGUF file as its model: its shape, weights,
// tokenizer ("auto") and model plugin (plugin = "auto": the one that computes
// the file's architecture) all from the file.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "session.hpp"
#include "test_support.hpp"

namespace tightfit::test {

inline std::string gguf_recipe(const std::string& corpus, const std::string& out_dir,
                               const std::string& gguf, const std::string& extra = "") {
  std::string recipe = tiny_recipe(corpus, out_dir, "", extra);
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(
      begin, end - begin,
      "[model]\nplugin = \"auto\"\nconfig = \"" + gguf + "\"\nweights = \"" + gguf + "\"\n\n");
  recipe.replace(recipe.find("tokenizer = \"byte\""), 18, "tokenizer = \"auto\"");
  return recipe;
}

// Three optimizer steps of `plain` and `kept` (the same recipe, its base
// kept another way) on one batch at lr 1e-2: the losses equal, step for step.
inline void expect_the_same_steps(Session& plain, Session& kept) {
  auto batch = plain.data().batcher().next();
  for (Session* s : {&plain, &kept}) s->update().optimizer().set_lr(1e-2);
  for (int step = 0; step < 3; ++step) {
    double loss[2];
    int i = 0;
    for (Session* s : {&plain, &kept}) {
      s->update().zero_grad();
      loss[i++] = s->executor().run_pass(batch.tokens, batch.targets, true, 1.0).loss;
      ASSERT_EQ(s->update().optimizer_step(), TF_OK);
    }
    EXPECT_TRUE(std::isfinite(loss[0]));
    EXPECT_EQ(loss[0], loss[1]) << "step " << step;
  }
}

}  // namespace tightfit::test
