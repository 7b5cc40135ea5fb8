#include "jinja_operators.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tightfit::jinja {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what);
}

Value membership(const std::string& op, const Value& a, const Value& b) {
  bool found = false;
  if (b.type == Value::kString)
    found = a.type == Value::kString && b.s.find(a.s) != std::string::npos;
  else if (b.type == Value::kList)
    for (const Value& x : *b.list) found = found || equal(a, x);
  else if (b.type == Value::kMap)
    found = b.map->find(a.str()) != nullptr;
  else if (b.defined())
    fail(std::string("'in' a ") + b.type_name());
  return Value::boolean(found == (op == "in"));
}

Value comparison(const std::string& op, const Value& a, const Value& b) {
  int cmp;
  if (a.is_number() && b.is_number())
    cmp = a.number() < b.number() ? -1 : a.number() > b.number();
  else if (a.type == Value::kString && b.type == Value::kString)
    cmp = a.s.compare(b.s);
  else
    fail("cannot compare a " + std::string(a.type_name()) + " with a " + b.type_name());
  return Value::boolean(op == "<"    ? cmp < 0
                        : op == ">"  ? cmp > 0
                        : op == "<=" ? cmp <= 0
                                     : cmp >= 0);
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number())
    fail("unsupported operand types for " + op + ": " + a.type_name() + " and " + b.type_name());
  const bool ints = a.type != Value::kFloat && b.type != Value::kFloat;
  const double x = a.number(), y = b.number();
  if (op == "/") {
    if (y == 0) fail("division by zero");
    return Value::real(x / y);
  }
  if (ints) {
    const int64_t p = a.type == Value::kBool ? a.b : a.i, q = b.type == Value::kBool ? b.b : b.i;
    if (op == "+") return Value::integer(p + q);
    if (op == "-") return Value::integer(p - q);
    if (op == "*") return Value::integer(p * q);
    if (q == 0) fail("division by zero");
    const int64_t fl = p / q - ((p % q != 0) && ((p < 0) != (q < 0)));  // Python's floor division
    if (op == "//") return Value::integer(fl);
    if (op == "%") return Value::integer(p - fl * q);
  }
  if (op == "+") return Value::real(x + y);
  if (op == "-") return Value::real(x - y);
  if (op == "*") return Value::real(x * y);
  if (y == 0) fail("division by zero");
  if (op == "//") return Value::real(std::floor(x / y));
  if (op == "%") return Value::real(x - std::floor(x / y) * y);
  fail("unknown operator " + op);
}

}  // namespace

Value binary_operator(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Value::boolean(equal(a, b));
  if (op == "!=") return Value::boolean(!equal(a, b));
  if (op == "~") return Value::string(a.str() + b.str());
  if (op == "in" || op == "not in") return membership(op, a, b);
  if (op == "<" || op == ">" || op == "<=" || op == ">=") return comparison(op, a, b);
  if (op == "+" && a.type == Value::kString && b.type == Value::kString)
    return Value::string(a.s + b.s);
  if (op == "+" && a.type == Value::kList && b.type == Value::kList) {
    List l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    return Value::of_list(std::move(l));
  }
  if (op == "*" && a.type == Value::kString && b.type == Value::kInt) {
    std::string s;
    for (int64_t k = 0; k < b.i && s.size() < kMaxTextBytes; ++k) s += a.s;
    return Value::string(s);
  }
  return arithmetic(op, a, b);
}

Value subscript(const Value& v, const Value& key) {
  if (v.type == Value::kMap) {
    const Value* x = v.map->find(key.str());
    return x ? *x : Value();
  }
  if ((v.type == Value::kList || v.type == Value::kString) && key.type == Value::kInt) {
    const int64_t size = static_cast<int64_t>(v.type == Value::kList ? v.list->size() : v.s.size());
    const int64_t k = key.i < 0 ? key.i + size : key.i;
    if (k < 0 || k >= size) return Value();
    return v.type == Value::kList ? (*v.list)[static_cast<size_t>(k)]
                                  : Value::string(std::string(1, v.s[static_cast<size_t>(k)]));
  }
  if (!v.defined()) fail("indexing an undefined value");
  return Value();
}

Value slice(const Value& v, std::optional<int64_t> start, std::optional<int64_t> stop,
            int64_t step) {
  if (step == 0) fail("slice step must not be zero");
  if (v.type != Value::kList && v.type != Value::kString)
    fail(std::string("cannot slice a ") + v.type_name());
  const int64_t n = static_cast<int64_t>(v.type == Value::kList ? v.list->size() : v.s.size());
  auto clamp = [&](std::optional<int64_t> x, int64_t fallback) {
    if (!x) return fallback;
    int64_t k = *x < 0 ? *x + n : *x;
    return step > 0 ? std::clamp<int64_t>(k, 0, n) : std::clamp<int64_t>(k, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1), s = clamp(stop, step > 0 ? n : -1);
  List out;
  std::string str;
  for (int64_t k = b; step > 0 ? k < s : k > s; k += step) {
    if (v.type == Value::kList)
      out.push_back((*v.list)[static_cast<size_t>(k)]);
    else
      str += v.s[static_cast<size_t>(k)];
  }
  if (v.type == Value::kList) return Value::of_list(std::move(out));
  return Value::string(str);
}

}  // namespace tightfit::jinja
