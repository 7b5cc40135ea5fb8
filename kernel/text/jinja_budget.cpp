#include "jinja_budget.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tightfit::jinja {
namespace {

thread_local Spent spent;

}  // namespace

void reset_budget() {
  spent = Spent{};
}

Spent budget_spent() {
  return spent;
}

void charge_steps(int64_t n) {
  spent.steps += n;
  if (spent.steps > kMaxSteps)
    throw std::runtime_error(
        "the template did more than 4,000,000 steps of work (a loop or a recursion that "
        "does not end?)");
}

void charge_bytes(size_t n) {
  spent.bytes += static_cast<int64_t>(std::min<size_t>(n, kMaxWorkBytes));
  if (spent.bytes > kMaxWorkBytes)
    throw std::runtime_error(
        "the template did more than 268,435,456 bytes of work on text (scanning or copying "
        "a big string in a loop?)");
}

void check_text(size_t n) {
  if (n > kMaxTextBytes)
    throw std::runtime_error("the template made a text of more than 64 MiB (" + std::to_string(n) +
                             " bytes)");
}

void charge_text(size_t n) {
  check_text(n);
  charge_bytes(n);
}

void check_value_depth(int depth) {
  if (depth > kMaxValueDepth)
    throw std::runtime_error(
        "a list or dict nested deeper than 100 levels (or one that holds itself)");
}

}  // namespace tightfit::jinja
