// Jinja's filters, tests, global functions and the Python string, dict and
// list methods chat templates call (internal to chat_template). Each throws
// std::runtime_error with what went wrong; the caller adds the place.
#pragma once

#include <string>

#include "jinja_value.hpp"

namespace tightfit::jinja {

Value apply_filter(const std::string& name, const Value& v, const Args& args);
bool apply_test(const std::string& name, const Value& v, const Args& args);
// `self.name(args)`; throws naming the method when `self` has none by that name.
Value call_method(const Value& self, const std::string& name, const Args& args);
// range, namespace, dict, raise_exception, strftime_now.
Value global_function(const std::string& name);

// Python's str.split, str.strip and friends.
std::string strip_chars(const std::string& s, const std::string* chars, bool left, bool right);

}  // namespace tightfit::jinja
