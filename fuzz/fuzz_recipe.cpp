// Recipe text: parsed, a --set override applied, and the kernel's tables
// validated. Anything wrong must come back as RecipeError (or
// std::invalid_argument from an override), never a crash.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "expand_input.hpp"
#include "recipe.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = expand_input(data, size);
  try {
    tightfit::Recipe r = tightfit::Recipe::parse(text, "fuzz.toml");
    for (const char* t : {"run", "model", "data", "optimizer", "schedule", "save"})
      (void)r.table(t);
    r.apply_override("run.steps=3");
    (void)r.to_toml();
  } catch (const tightfit::RecipeError&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
