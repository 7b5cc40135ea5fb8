#include "jinja_operators.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "jinja_builtins.hpp"
#include "jinja_text.hpp"

namespace tightfit::jinja {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what);
}

Value membership(const std::string& op, const Value& a, const Value& b) {
  bool found = false;
  if (b.type == Value::kString) {
    if (a.type == Value::kString) {
      charge_bytes(b.s().size());
      found = TextSearch(a.s()).find(b.s()) != std::string::npos;
    }
  } else if (b.type == Value::kList) {
    for (const Value& x : *b.list)
      if (equal(a, x)) {
        found = true;
        break;
      }
  } else if (b.type == Value::kMap)
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
    charge_bytes(std::min(a.s().size(), b.s().size())), cmp = a.s().compare(b.s());
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
    int64_t r = 0;
    auto fits = [&](bool overflowed) {
      if (overflowed) fail("the integer result of " + op + " does not fit 64 bits");
      return Value::integer(r);
    };
    if (op == "+") return fits(__builtin_add_overflow(p, q, &r));
    if (op == "-") return fits(__builtin_sub_overflow(p, q, &r));
    if (op == "*") return fits(__builtin_mul_overflow(p, q, &r));
    if (q == 0) fail("division by zero");
    if (q == -1) {  // the one quotient that overflows: INT64_MIN // -1
      if (op == "%") return Value::integer(0);
      return fits(__builtin_sub_overflow(int64_t{0}, p, &r));
    }
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
  if (op == "~") {
    std::string x = a.str();
    const std::string y = b.str();
    check_text(x.size() + y.size());
    return Value::string(std::move(x) + y);
  }
  if (op == "in" || op == "not in") return membership(op, a, b);
  if (op == "<" || op == ">" || op == "<=" || op == ">=") return comparison(op, a, b);
  if (op == "+" && a.type == Value::kString && b.type == Value::kString) {
    check_text(a.s().size() + b.s().size());
    return Value::string(a.s() + b.s());
  }
  if (op == "+" && a.type == Value::kList && b.type == Value::kList) {
    charge_steps(static_cast<int64_t>(a.list->size() + b.list->size()));  // before the copy
    List l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    return Value::of_list(std::move(l));
  }
  if (op == "*" && a.type == Value::kString && b.type == Value::kInt) {
    const size_t n = static_cast<size_t>(std::max<int64_t>(b.i, 0));
    if (!a.s().empty() && n > kMaxTextBytes / a.s().size())  // bounded before it is made
      check_text(n > kMaxTextBytes ? n : n * a.s().size());
    const size_t total = n * a.s().size();
    std::string s;
    s.reserve(total);
    if (total > 0) s = a.s();
    // Doubling: memcpy speed, not a byte a time (and nothing to double when
    // the result is empty: found by fuzz_chat_template as a hang on 'x' * 0).
    while (!s.empty() && s.size() * 2 <= total) s.append(s);
    s.append(s, 0, total - s.size());
    return Value::string(std::move(s));
  }
  return arithmetic(op, a, b);
}

Value subscript(const Value& v, const Value& key) {
  if (v.type == Value::kMap) {
    const Value* x = v.map->find(key.str());
    return x ? *x : Value();
  }
  if (v.type == Value::kList && key.type == Value::kInt) {
    const auto size = static_cast<int64_t>(v.list->size());
    const int64_t k = key.i < 0 ? key.i + size : key.i;
    if (k < 0 || k >= size) return Value();
    return (*v.list)[static_cast<size_t>(k)];
  }
  if (v.type == Value::kString && key.type == Value::kInt) {
    const CodePoints chars(v.s());
    const int64_t k = key.i < 0 ? key.i + chars.size() : key.i;
    if (k < 0 || k >= chars.size()) return Value();
    return Value::string(std::string(chars.at(k)));
  }
  if (!v.defined()) fail("indexing an undefined value");
  return Value();
}

Value slice(const Value& v, std::optional<int64_t> start, std::optional<int64_t> stop,
            int64_t step) {
  if (step == 0) fail("slice step must not be zero");
  if (v.type != Value::kList && v.type != Value::kString)
    fail(std::string("cannot slice a ") + v.type_name());
  std::optional<CodePoints> chars;
  if (v.type == Value::kString) chars.emplace(v.s());
  const int64_t n = chars ? chars->size() : static_cast<int64_t>(v.list->size());
  auto clamp = [&](std::optional<int64_t> x, int64_t fallback) {
    if (!x) return fallback;
    const int64_t k = *x < 0 ? *x + n : *x;  // no overflow: n >= 0 is added to a negative
    return step > 0 ? std::clamp<int64_t>(k, 0, n) : std::clamp<int64_t>(k, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1), s = clamp(stop, step > 0 ? n : -1);
  // How many items, counted without stepping past the ends (a step of 2^63
  // must not wrap around).
  const __int128 span = step > 0 ? __int128{s} - b : __int128{b} - s;
  const __int128 stride = step > 0 ? __int128{step} : -__int128{step};
  const int64_t count = span <= 0 ? 0 : static_cast<int64_t>((span + stride - 1) / stride);
  charge_steps(count);
  List out;
  std::string str;
  for (int64_t j = 0; j < count; ++j) {
    const auto k = static_cast<size_t>(b + j * step);  // stays within [0, n)
    if (v.type == Value::kList)
      out.push_back((*v.list)[k]);
    else
      str += chars->at(static_cast<int64_t>(k));
  }
  if (v.type == Value::kList) return Value::of_list(std::move(out));
  return Value::string(str);
}

}  // namespace tightfit::jinja
