#include "jinja_builtins.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <stdexcept>

#include "jinja_budget.hpp"
#include "jinja_text.hpp"

namespace tightfit::jinja {

// By value: the fallback is often a temporary, which a returned reference
// would outlive.
Value arg(const Args& a, size_t k, const char* name, const Value& fallback) {
  if (k < a.positional.size()) return a.positional[k];
  if (const Value* v = a.keyword(name)) return *v;
  return fallback;
}

const std::string& need_string(const Value& v, const char* what) {
  if (v.type != Value::kString)
    throw std::runtime_error(std::string(what) + " needs a string, not " + v.type_name());
  charge_bytes(v.s().size());  // whatever reads it scans it once
  return v.s();
}

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what);
}

bool is_space(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string title_case(std::string s) {
  bool start = true;
  for (char& c : s) {
    const auto u = static_cast<unsigned char>(c);
    c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
    start = !std::isalpha(u);
  }
  return s;
}

Value split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (!sep.defined() || sep.type == Value::kNone) {  // runs of whitespace
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_space(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        rest.erase(rest.find_last_not_of(" \t\n\r\f\v") + 1);
        out.push_back(Value::string(rest));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_space(static_cast<unsigned char>(s[j]))) ++j;
      out.push_back(Value::string(s.substr(i, j - i)));
      i = j;
    }
    return Value::of_list(std::move(out));
  }
  const std::string& d = need_string(sep, "split");
  if (d.empty()) fail("split: empty separator");
  const TextSearch search(d);
  size_t start = 0;
  for (;;) {
    const size_t at = search.find(s, start);
    if (at == std::string::npos ||
        (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.push_back(Value::string(s.substr(start)));
      break;
    }
    out.push_back(Value::string(s.substr(start, at - start)));
    start = at + d.size();
  }
  return Value::of_list(std::move(out));
}

bool affix(const Value& self, const Value& what, bool prefix) {
  auto one = [&](const std::string& p) {
    const std::string& s = self.s();
    return s.size() >= p.size() && s.compare(prefix ? 0 : s.size() - p.size(), p.size(), p) == 0;
  };
  if (what.type == Value::kList) {
    for (const Value& p : *what.list)
      if (one(need_string(p, "startswith/endswith"))) return true;
    return false;
  }
  return one(need_string(what, "startswith/endswith"));
}

std::string replace(std::string s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  const TextSearch search(from);
  std::string out;
  size_t start = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t at = search.find(s, start);
    if (at == std::string::npos) break;
    check_text(out.size() + (at - start) + to.size());  // bounded before it grows
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
  }
  check_text(out.size() + (s.size() - start));
  out.append(s, start, std::string::npos);
  return out;
}

int64_t length(const Value& v) {
  switch (v.type) {
    case Value::kString:
      return CodePoints(v.s()).size();  // characters, not bytes
    case Value::kList:
      return static_cast<int64_t>(v.list->size());
    case Value::kMap:
      return static_cast<int64_t>(v.map->items.size());
    default:
      fail(std::string("length of a ") + v.type_name());
  }
}

// transformers' tojson filter: tojson(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), passed on to json.dumps as they are.
JsonStyle json_style(const Args& a) {
  static const Value none = Value::none();
  for (const auto& [name, value] : a.keywords)
    if (name != "ensure_ascii" && name != "indent" && name != "separators" && name != "sort_keys")
      fail("tojson got an unexpected keyword argument '" + name + "'");
  if (a.positional.size() > 4) fail("tojson takes at most 4 arguments");
  JsonStyle style;
  style.ensure_ascii = arg(a, 0, "ensure_ascii", Value::boolean(false)).truthy();
  const Value indent = arg(a, 1, "indent", none);
  // json.dumps: indent=None is compact; an integer (0 and below too) or a
  // string starts a line for each item, indented by that many spaces or
  // that string per level.
  if (indent.type == Value::kInt) {
    if (indent.i > static_cast<int64_t>(kMaxTextBytes))
      fail("tojson: an indent of " + std::to_string(indent.i) +
           " makes a text of more than 64 MiB");
    style.indent.assign(static_cast<size_t>(std::max<int64_t>(indent.i, 0)), ' ');
    style.pretty = true;
  } else if (indent.type == Value::kString) {
    style.indent = indent.s();
    style.pretty = true;
  } else if (indent.type != Value::kNone) {
    fail("tojson: indent must be an integer, a string or none");
  }
  if (style.pretty) style.item_separator = ",";
  const Value separators = arg(a, 2, "separators", none);
  if (separators.type == Value::kList) {
    if (separators.list->size() != 2 || (*separators.list)[0].type != Value::kString ||
        (*separators.list)[1].type != Value::kString)
      fail("tojson: separators must be two strings (item, key)");
    style.item_separator = (*separators.list)[0].s();
    style.key_separator = (*separators.list)[1].s();
  } else if (separators.type != Value::kNone) {
    fail("tojson: separators must be two strings (item, key) or none");
  }
  style.sort_keys = arg(a, 3, "sort_keys", Value::boolean(false)).truthy();
  return style;
}

Value items(const Value& v) {
  if (v.type != Value::kMap) fail(std::string("items() of a ") + v.type_name());
  List out;
  for (const auto& [k, x] : v.map->items) out.push_back(Value::of_list({Value::string(k), x}));
  return Value::of_list(std::move(out));
}

// Jinja's int filter: int(value), else int(float(value)), else 0; a value
// past 64 bits is an error rather than Python's unbounded integer.
Value to_int(const Value& v) {
  if (v.type == Value::kInt) return v;
  double x = v.number();
  if (v.type == Value::kString) {
    const std::string t = strip_chars(v.s(), nullptr, true, true);
    std::string digits;  // Python's int() takes "1_000"
    for (char c : t)
      if (c != '_') digits += c;
    int64_t whole = 0;
    const char* end = digits.data() + digits.size();
    const char* first = digits.data() + (!digits.empty() && digits[0] == '+');
    const auto [p, ec] = std::from_chars(first, end, whole);
    if (!digits.empty() && p == end) {
      if (ec == std::errc::result_out_of_range) fail("int: '" + t + "' does not fit 64 bits");
      if (ec == std::errc()) return Value::integer(whole);
    }
    char* fend = nullptr;
    x = std::strtod(t.c_str(), &fend);
    if (t.empty() || fend != t.c_str() + t.size()) return Value::integer(0);
  }
  if (std::isnan(x)) fail("int of nan");
  const double whole = std::trunc(x);  // -2^63 <= whole < 2^63 converts exactly
  if (!(whole >= -9223372036854775808.0 && whole < 9223372036854775808.0))
    fail("int: " + v.str() + " does not fit 64 bits");
  return Value::integer(static_cast<int64_t>(whole));
}

}  // namespace

TextSearch::TextSearch(const std::string& needle) : needle_(needle), border_(needle.size(), 0) {
  for (size_t k = 1, b = 0; k < needle.size(); ++k) {
    while (b > 0 && needle[k] != needle[b]) b = border_[b - 1];
    if (needle[k] == needle[b]) ++b;
    border_[k] = b;
  }
}

size_t TextSearch::find(const std::string& hay, size_t from) const {
  if (needle_.empty()) return from <= hay.size() ? from : std::string::npos;
  for (size_t k = from, b = 0; k < hay.size(); ++k) {
    while (b > 0 && hay[k] != needle_[b]) b = border_[b - 1];
    if (hay[k] == needle_[b]) ++b;
    if (b == needle_.size()) return k + 1 - b;
  }
  return std::string::npos;
}

std::string strip_chars(const std::string& s, const std::string* chars, bool left, bool right) {
  auto strip_it = [&](unsigned char c) {
    return chars ? chars->find(static_cast<char>(c)) != std::string::npos : is_space(c);
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && strip_it(static_cast<unsigned char>(s[b]))) ++b;
  if (right)
    while (e > b && strip_it(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

Value apply_filter(const std::string& name, const Value& v, const Args& a) {
  static const Value none = Value::none();
  if (name == "trim") {
    const Value& chars = arg(a, 0, "chars", Value());
    return Value::string(strip_chars(
        need_string(v, "trim"), chars.type == Value::kString ? &chars.s() : nullptr, true, true));
  }
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "upper") return Value::string(ascii_upper(need_string(v, "upper")));
  if (name == "lower") return Value::string(ascii_lower(need_string(v, "lower")));
  if (name == "title") return Value::string(title_case(need_string(v, "title")));
  if (name == "capitalize") {
    std::string s = ascii_lower(need_string(v, "capitalize"));
    if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return Value::string(s);
  }
  if (name == "string") return Value::string(v.str());
  if (name == "safe" || name == "e" || name == "escape")
    return v.type == Value::kString ? v : Value::string(v.str());
  if (name == "tojson") return Value::string(v.to_json(json_style(a)));
  if (name == "int") return to_int(v);
  if (name == "float") {
    if (v.type != Value::kString) return Value::real(v.number());
    const std::string t = strip_chars(v.s(), nullptr, true, true);
    char* end = nullptr;
    const double x = std::strtod(t.c_str(), &end);
    return Value::real(!t.empty() && end == t.c_str() + t.size() ? x : 0.0);  // Jinja: 0.0
  }
  if (name == "abs") {
    if (v.type != Value::kInt) return Value::real(std::abs(v.number()));
    if (v.i == INT64_MIN) fail("abs of the smallest integer does not fit 64 bits");
    return Value::integer(std::llabs(v.i));
  }
  if (name == "first" || name == "last") {
    if (v.type == Value::kList)
      return v.list->empty() ? Value() : (name == "first" ? v.list->front() : v.list->back());
    if (v.type == Value::kString && !v.s().empty())
      return Value::string(std::string(1, name == "first" ? v.s().front() : v.s().back()));
    return Value();
  }
  if (name == "list") {
    if (v.type == Value::kList) return v;
    if (v.type == Value::kMap) {
      List keys;
      for (const auto& [k, x] : v.map->items) keys.push_back(Value::string(k));
      return Value::of_list(std::move(keys));
    }
    const CodePoints chars(need_string(v, "list"));
    List out;
    for (int64_t k = 0; k < chars.size(); ++k)
      out.push_back(Value::string(std::string(chars.at(k))));
    return Value::of_list(std::move(out));
  }
  if (name == "reverse") {
    if (v.type == Value::kString) {
      const CodePoints chars(v.s());
      std::string out;
      out.reserve(v.s().size());
      for (int64_t k = chars.size() - 1; k >= 0; --k) out += chars.at(k);
      return Value::string(std::move(out));
    }
    if (v.type != Value::kList) fail(std::string("reverse of a ") + v.type_name());
    return Value::of_list(List(v.list->rbegin(), v.list->rend()));
  }
  if (name == "items") return items(v);
  if (name == "join") {
    const Value& sep = arg(a, 0, "d", Value::string(""));
    const Value& attribute = arg(a, 1, "attribute", Value());
    if (v.type != Value::kList) fail(std::string("join of a ") + v.type_name());
    const std::string separator = sep.str();
    std::string out;
    for (size_t k = 0; k < v.list->size(); ++k) {
      const Value& e = (*v.list)[k];
      const Value* x = &e;
      if (attribute.type == Value::kString && e.type == Value::kMap) x = e.map->find(attribute.s());
      const std::string piece = x ? x->str() : std::string();
      check_text(out.size() + (k ? separator.size() : 0) + piece.size());  // before it grows
      if (k) out += separator;
      out += piece;
    }
    return Value::string(out);
  }
  if (name == "replace") {
    const Value& count = arg(a, 2, "count", none);
    return Value::string(replace(
        need_string(v, "replace"), need_string(arg(a, 0, "old", none), "replace"),
        need_string(arg(a, 1, "new", none), "replace"), count.type == Value::kInt ? count.i : -1));
  }
  if (name == "default" || name == "d") {
    const bool boolean = arg(a, 1, "boolean", Value::boolean(false)).truthy();
    return (boolean ? v.truthy() : v.defined()) ? v : arg(a, 0, "default_value", Value::string(""));
  }
  if (name == "indent") {
    const Value& width = arg(a, 0, "width", Value::integer(4));
    const bool first = arg(a, 1, "first", Value::boolean(false)).truthy();
    if (width.type == Value::kInt) check_text(static_cast<size_t>(std::max<int64_t>(0, width.i)));
    const std::string pad =
        width.type == Value::kString
            ? width.s()
            : std::string(static_cast<size_t>(std::max<int64_t>(0, width.i)), ' ');
    std::string out;
    const std::string& s = need_string(v, "indent");
    for (size_t k = 0; k < s.size(); ++k) {
      out += s[k];
      if (s[k] == '\n' && k + 1 < s.size() && s[k + 1] != '\n') {
        check_text(out.size() + pad.size());  // bounded before it grows
        out += pad;
      }
    }
    check_text(out.size() + (first ? pad.size() : 0));
    return Value::string((first ? pad : "") + out);
  }
  if (name == "map" || name == "selectattr" || name == "rejectattr") {
    if (v.type != Value::kList) fail(name + " of a " + v.type_name());
    const Value* attribute = a.keyword("attribute");
    List out;
    for (const Value& e : *v.list) {
      if (name == "map") {
        if (!attribute) fail("map: only map(attribute='...') is supported");
        const Value* x = e.type == Value::kMap ? e.map->find(attribute->s()) : nullptr;
        out.push_back(x ? *x : Value());
        continue;
      }
      const std::string key = need_string(arg(a, 0, "attr", none), name.c_str());
      const Value* x = e.type == Value::kMap ? e.map->find(key) : nullptr;
      bool pass = x && x->truthy();
      if (a.positional.size() > 1) {
        Args rest;
        rest.positional.assign(a.positional.begin() + 2, a.positional.end());
        pass = apply_test(need_string(a.positional[1], name.c_str()), x ? *x : Value(), rest);
      }
      if (pass == (name == "selectattr")) out.push_back(e);
    }
    return Value::of_list(std::move(out));
  }
  fail("the filter '" + name + "' is not supported");
}

bool apply_test(const std::string& name, const Value& v, const Args& a) {
  static const Value none = Value::none();
  if (name == "defined") return v.defined();
  if (name == "undefined") return !v.defined();
  if (name == "none") return v.type == Value::kNone;
  if (name == "string") return v.type == Value::kString;
  if (name == "number") return v.type == Value::kInt || v.type == Value::kFloat;
  if (name == "integer") return v.type == Value::kInt;
  if (name == "float") return v.type == Value::kFloat;
  if (name == "boolean") return v.type == Value::kBool;
  if (name == "true") return v.type == Value::kBool && v.b;
  if (name == "false") return v.type == Value::kBool && !v.b;
  if (name == "mapping") return v.type == Value::kMap;
  if (name == "sequence" || name == "iterable")
    return v.type == Value::kList || v.type == Value::kString || v.type == Value::kMap;
  if (name == "callable") return v.type == Value::kFunction;
  if (name == "odd" || name == "even") {
    if (v.type != Value::kInt) fail(name + " test of a " + v.type_name());
    return (v.i % 2 != 0) == (name == "odd");  // INT64_MIN % 2 is defined
  }
  if (name == "divisibleby") {
    const Value& n = arg(a, 0, "num", none);
    if (v.type != Value::kInt || n.type != Value::kInt || n.i == 0)
      fail("divisibleby needs integers");
    return n.i == -1 || v.i % n.i == 0;  // INT64_MIN % -1 would trap
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg(a, 0, "other", none));
  if (name == "ne" || name == "!=") return !equal(v, arg(a, 0, "other", none));
  if (name == "lower") return v.type == Value::kString && ascii_lower(v.s()) == v.s();
  if (name == "upper") return v.type == Value::kString && ascii_upper(v.s()) == v.s();
  fail("the test '" + name + "' is not supported");
}

Value call_method(const Value& self, const std::string& name, const Args& a) {
  static const Value none = Value::none();
  if (self.type == Value::kString) {
    const std::string& s = self.s();
    charge_bytes(s.size());  // every method reads the string once
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const Value& chars = arg(a, 0, "chars", none);
      return Value::string(strip_chars(s, chars.type == Value::kString ? &chars.s() : nullptr,
                                       name != "rstrip", name != "lstrip"));
    }
    if (name == "split") {
      const Value& maxsplit = arg(a, 1, "maxsplit", Value::integer(-1));
      return split(s, arg(a, 0, "sep", none), maxsplit.type == Value::kInt ? maxsplit.i : -1);
    }
    if (name == "startswith") return Value::boolean(affix(self, arg(a, 0, "prefix", none), true));
    if (name == "endswith") return Value::boolean(affix(self, arg(a, 0, "suffix", none), false));
    if (name == "upper") return Value::string(ascii_upper(s));
    if (name == "lower") return Value::string(ascii_lower(s));
    if (name == "title") return Value::string(title_case(s));
    if (name == "capitalize") return apply_filter("capitalize", self, a);
    if (name == "replace") {
      const Value& count = arg(a, 2, "count", none);
      return Value::string(replace(s, need_string(arg(a, 0, "old", none), "replace"),
                                   need_string(arg(a, 1, "new", none), "replace"),
                                   count.type == Value::kInt ? count.i : -1));
    }
    if (name == "find") {
      const size_t at = TextSearch(need_string(arg(a, 0, "sub", none), "find")).find(s);
      return Value::integer(at == std::string::npos ? -1 : CodePoints(s).index_of_byte(at));
    }
    if (name == "count") {
      const std::string sub = need_string(arg(a, 0, "sub", none), "count");
      if (sub.empty()) return Value::integer(length(self) + 1);  // Python: between characters
      const TextSearch search(sub);
      int64_t n = 0;
      for (size_t at = search.find(s); at != std::string::npos;
           at = search.find(s, at + sub.size()))
        ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      const Value& items_v = arg(a, 0, "iterable", none);
      if (items_v.type != Value::kList) fail("join needs a list");
      std::string out;
      for (size_t k = 0; k < items_v.list->size(); ++k) {
        const std::string& piece = need_string((*items_v.list)[k], "join");
        check_text(out.size() + (k ? s.size() : 0) + piece.size());  // before it grows
        if (k) out += s;
        out += piece;
      }
      return Value::string(out);
    }
  }
  if (self.type == Value::kMap) {
    if (name == "get") {
      const Value* v = self.map->find(need_string(arg(a, 0, "key", none), "get"));
      return v ? *v : arg(a, 1, "default", none);
    }
    if (name == "items") return items(self);
    if (name == "keys" || name == "values") {
      List out;
      for (const auto& [k, v] : self.map->items)
        out.push_back(name == "keys" ? Value::string(k) : v);
      return Value::of_list(std::move(out));
    }
  }
  fail(std::string("a ") + self.type_name() + " has no method '" + name + "' that is supported");
}

}  // namespace tightfit::jinja
