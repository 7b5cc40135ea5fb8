// Python's operators on chat-template values, as Jinja evaluates them
// (internal to chat_template): comparisons, membership, arithmetic with
// Python's floor division and modulo, concatenation, subscripts and slices.
// Each throws std::runtime_error with what went wrong; the caller adds the
// place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "jinja_budget.hpp"
#include "jinja_value.hpp"

namespace tightfit::jinja {

// a op b for every binary operator but the short-circuit `and` and `or`.
// Integers are 64 bits: a result past them is an error, never a wrap.
Value binary_operator(const std::string& op, const Value& a, const Value& b);

// v[key]: a map's entry, a list's or string's item (negative counts from the
// end); undefined when absent.
Value subscript(const Value& v, const Value& key);

// v[start:stop:step] of a list or string, bounds clamped as Python does.
Value slice(const Value& v, std::optional<int64_t> start, std::optional<int64_t> stop,
            int64_t step);

}  // namespace tightfit::jinja
