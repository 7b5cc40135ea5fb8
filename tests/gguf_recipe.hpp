// The tests' tiny recipe with a GGUF file as its model: its shape, weights
// and tokenizer ("auto") all from the file.
#pragma once

#include <string>

#include "test_support.hpp"

namespace tightfit::test {

inline std::string gguf_recipe(const std::string& corpus, const std::string& out_dir,
                               const std::string& gguf, const std::string& extra = "") {
  std::string recipe = tiny_recipe(corpus, out_dir, "", extra);
  const auto begin = recipe.find("[model]"), end = recipe.find("[data]");
  recipe.replace(
      begin, end - begin,
      "[model]\nplugin = \"llama\"\nconfig = \"" + gguf + "\"\nweights = \"" + gguf + "\"\n\n");
  recipe.replace(recipe.find("tokenizer = \"byte\""), 18, "tokenizer = \"auto\"");
  return recipe;
}

}  // namespace tightfit::test
