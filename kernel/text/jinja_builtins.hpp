// Jinja's filters, tests, global functions and the Python string, dict and
// list methods chat templates call (internal to chat_template). Each throws
// std::runtime_error with what went wrong; the caller adds the place.
#pragma once

#include <string>
#include <vector>

#include "jinja_value.hpp"

namespace tightfit::jinja {

Value apply_filter(const std::string& name, const Value& v, const Args& args);
bool apply_test(const std::string& name, const Value& v, const Args& args);
// `self.name(args)`; throws naming the method when `self` has none by that name.
Value call_method(const Value& self, const std::string& name, const Args& args);
// range, namespace, dict, raise_exception, strftime_now.
Value global_function(const std::string& name);

// Finds a needle in texts in time linear in both (Knuth-Morris-Pratt): a
// needle that almost matches everywhere costs no more than any other.
class TextSearch {
 public:
  explicit TextSearch(const std::string& needle);
  // The first place at or after `from` where the needle starts, or npos.
  size_t find(const std::string& hay, size_t from = 0) const;

 private:
  const std::string& needle_;
  std::vector<size_t> border_;  // border_[k]: the longest proper border of needle[0..k]
};

// A call's argument: positional `k`, else the keyword `name`, else `fallback`.
Value arg(const Args& a, size_t k, const char* name, const Value& fallback);
// v's text, charged to the budget as read; throws naming `what` when v is no string.
const std::string& need_string(const Value& v, const char* what);

// Python's str.split, str.strip and friends.
std::string strip_chars(const std::string& s, const std::string* chars, bool left, bool right);

}  // namespace tightfit::jinja
