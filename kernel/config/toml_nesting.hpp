// TOML nesting bound, checked before a text reaches TOML++. The library
// limits nested arrays and inline tables itself, but not tables made by
// dotted keys: a header "[a.a.a....]" a few hundred thousand keys long builds
// tables as deep, and the recursion that destroys them overflows the stack.
#pragma once

#include <string>

namespace tightfit {

// Deeper than any recipe needs (real ones nest 3) and shallow enough for the
// recursion, under sanitizers too.
constexpr int kMaxTomlNesting = 200;

// Throws RecipeError naming source:line:column when a table, array or value
// would sit deeper than kMaxTomlNesting. Text it cannot follow (an unclosed
// string, a stray bracket) it leaves for TOML++ to report.
void check_toml_nesting(const std::string& text, const std::string& source);

}  // namespace tightfit
