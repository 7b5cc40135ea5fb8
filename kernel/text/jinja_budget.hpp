// What one chat-template render may spend (internal to chat_template). A
// model folder is untrusted input: a template that loops over a huge range,
// recurses twice per level, doubles a string or a list, or scans a big string
// again and again stops with an error in well under a second, while the
// templates of the families tightfit fine-tunes use a small fraction of each
// bound (measured in test_template_bounds).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tightfit::jinja {

// The most text one string, or the whole output, may hold.
constexpr size_t kMaxTextBytes = size_t{64} << 20;
// Steps of work: expressions evaluated, tags rendered, list items made or
// compared.
constexpr int64_t kMaxSteps = 4'000'000;
// Bytes of work: text made, copied out or scanned by operators and filters.
constexpr int64_t kMaxWorkBytes = int64_t{256} << 20;
// Nesting while rendering: expressions, blocks and macro calls inside each
// other (the C++ stack this takes stays under 2 MiB).
constexpr int kMaxRenderDepth = 1000;
// Nesting of lists and dicts that are printed, compared, converted to JSON
// or read from the context.
constexpr int kMaxValueDepth = 100;

// Starts a fresh budget for the render about to run on this thread.
void reset_budget();
// What the last render on this thread spent (for the tests that show the
// bounds leave real templates room).
struct Spent {
  int64_t steps = 0;
  int64_t bytes = 0;
};
Spent budget_spent();
// Charge `n` steps or bytes; throws std::runtime_error past the bound.
void charge_steps(int64_t n);
void charge_bytes(size_t n);
// A string of `n` bytes is about to be made: throws std::runtime_error
// before it is, when n passes kMaxTextBytes; else charges it as work.
void charge_text(size_t n);
// The same bound without the charge, for a text that is still growing.
void check_text(size_t n);
// Throws std::runtime_error when a value is nested past kMaxValueDepth.
void check_value_depth(int depth);

}  // namespace tightfit::jinja
