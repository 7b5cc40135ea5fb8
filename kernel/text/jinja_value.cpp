#include "jinja_value.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "jinja_budget.hpp"

namespace tightfit::jinja {

const Value* Args::keyword(const std::string& name) const {
  for (const auto& [k, v] : keywords)
    if (k == name) return &v;
  return nullptr;
}

namespace {
constexpr size_t kIndexFrom = 16;  // a dict this big is looked up through its index
}  // namespace

const Value* Map::find(const std::string& key) const {
  if (!index_.empty()) {
    const auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items[it->second].second;
  }
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Map::set(const std::string& key, Value v) {
  if (Value* old = const_cast<Value*>(find(key))) {
    *old = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
  if (!index_.empty())
    index_.emplace(key, items.size() - 1);
  else if (items.size() >= kIndexFrom)
    for (size_t k = 0; k < items.size(); ++k) index_.emplace(items[k].first, k);
}

Value Value::string(std::string v) {
  charge_text(v.size());
  Value x = with(kString);
  x.text = std::make_shared<const std::string>(std::move(v));
  return x;
}

const std::string& Value::s() const {
  static const std::string empty;
  return text ? *text : empty;
}

Value::~Value() {
  if (!list && !map) return;
  // Children go to a list of this thread's that the outermost destructor
  // empties: each level is freed by the loop, not by a deeper call.
  thread_local std::vector<std::shared_ptr<void>> pending;
  thread_local bool draining = false;
  if (list) pending.push_back(std::move(list));
  if (map) pending.push_back(std::move(map));
  if (draining) return;
  draining = true;
  while (!pending.empty()) {
    std::shared_ptr<void> last = std::move(pending.back());
    pending.pop_back();
    last.reset();  // may push its own children
  }
  draining = false;
}

Value Value::of_list(List v) {
  charge_steps(static_cast<int64_t>(v.size()));
  Value x = with(kList);
  x.list = std::make_shared<List>(std::move(v));
  return x;
}

Value Value::of_map() {
  Value x = with(kMap);
  x.map = std::make_shared<Map>();
  return x;
}

Value Value::from_json(const nlohmann::ordered_json& j, int depth) {
  check_value_depth(depth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                 ? real(static_cast<double>(j.get<uint64_t>()))
                 : integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e, depth + 1));
      return of_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value m = of_map();
      for (auto it = j.begin(); it != j.end(); ++it)
        m.map->set(it.key(), from_json(it.value(), depth + 1));
      return m;
    }
    default:
      return Value();
  }
}

bool Value::truthy() const {
  switch (type) {
    case kUndefined:
    case kNone:
      return false;
    case kBool:
      return b;
    case kInt:
      return i != 0;
    case kFloat:
      return f != 0;
    case kString:
      return !s().empty();
    case kList:
      return !list->empty();
    case kMap:
      return !map->items.empty();
    case kFunction:
      return true;
  }
  return false;
}

namespace {
std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {  // the shortest that round-trips
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  // Python writes 1e+20 as 1e+20 and 1e-05 as 1e-05: %g agrees.
  return s;
}

// Appending `n` more bytes to `out` keeps it within kMaxTextBytes: checked
// before the bytes are made, so a list of big strings fails at the first one
// that does not fit.
void room_for(const std::string& out, size_t n) {
  check_text(out.size() + n);
}

// A code point's \uXXXX escape (a surrogate pair past U+FFFF), as
// json.dumps(ensure_ascii=True) writes it.
void append_u_escape(std::string& out, uint32_t cp) {
  char buf[16];
  if (cp > 0xFFFF) {
    cp -= 0x10000;
    std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
  } else {
    std::snprintf(buf, sizeof buf, "\\u%04x", cp);
  }
  out += buf;
}

// The UTF-8 sequence at s[k] as a code point; advances k past it. A byte
// that begins no whole sequence is taken alone, as a code point of its own
// value (only text that is not UTF-8 has one).
uint32_t next_code_point(const std::string& s, size_t& k) {
  const auto c = static_cast<unsigned char>(s[k]);
  const size_t extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
  if (extra == 0) {
    ++k;
    return c;
  }
  uint32_t cp = c & (0x3F >> extra);
  for (size_t i = 1; i <= extra; ++i) {
    const auto d = k + i < s.size() ? static_cast<unsigned char>(s[k + i]) : 0;
    if ((d & 0xC0) != 0x80) {
      ++k;
      return c;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  k += extra + 1;
  return cp;
}

// How json.dumps writes one character: as it is, a short escape, or \uXXXX.
// ensure_ascii escapes everything outside ' '..'~'; without it only the
// control characters, '"' and '\\' are escaped.
const char* short_escape(unsigned char c) {
  switch (c) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      return nullptr;
  }
}

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  // What the escapes will take, counted before they are made.
  size_t bytes = 2;
  for (size_t k = 0; k < s.size();) {
    const auto c = static_cast<unsigned char>(s[k]);
    if (c >= 0x80 && ensure_ascii) {
      bytes += next_code_point(s, k) > 0xFFFF ? 12 : 6;
      continue;
    }
    ++k;
    bytes += short_escape(c) ? 2 : c < 0x20 || (ensure_ascii && c == 0x7F) ? 6 : 1;
  }
  room_for(out, bytes);
  out += '"';
  for (size_t k = 0; k < s.size();) {
    const auto c = static_cast<unsigned char>(s[k]);
    if (c >= 0x80 && ensure_ascii) {
      append_u_escape(out, next_code_point(s, k));
      continue;
    }
    ++k;
    if (const char* e = short_escape(c))
      out += e;
    else if (c < 0x20 || (ensure_ascii && c == 0x7F))
      append_u_escape(out, c);
    else
      out += static_cast<char>(c);
  }
  out += '"';
}

void append_python_repr(std::string& out, const std::string& s) {
  room_for(out, s.size() + 2);
  const bool has_single = s.find('\'') != std::string::npos;
  const char q = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  out += q;
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == static_cast<unsigned char>(q))
      out += std::string("\\") + q;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else
      out += static_cast<char>(c);
  }
  out += q;
  check_text(out.size());
}

// Python's repr of v, appended to out: one buffer for the whole value, so
// printing is linear in what it prints however deep the value is.
void append_repr(std::string& out, const Value& v, int depth) {
  check_value_depth(depth);
  switch (v.type) {
    case Value::kString:
      return append_python_repr(out, v.s());
    case Value::kList:
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        append_repr(out, (*v.list)[k], depth + 1);
      }
      out += ']';
      return;
    case Value::kMap:
      out += '{';
      for (size_t k = 0; k < v.map->items.size(); ++k) {
        if (k) out += ", ";
        append_python_repr(out, v.map->items[k].first);
        out += ": ";
        append_repr(out, v.map->items[k].second, depth + 1);
      }
      out += '}';
      return;
    case Value::kFunction:
      out += "<function>";
      return;
    default:
      out += v.str();
      check_text(out.size());
  }
}

// json.dumps(v, **style) appended to out.
void append_json(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  check_value_depth(depth);
  auto newline = [&](int level) {
    if (!style.pretty) return;
    // The padding is bounded before it is made.
    room_for(out, 1 + style.indent.size() * static_cast<size_t>(level));
    out += '\n';
    for (int i = 0; i < level; ++i) out += style.indent;
  };
  auto separate = [&](const std::string& separator) {  // separators may be long
    room_for(out, separator.size());
    out += separator;
  };
  switch (v.type) {
    case Value::kUndefined:
    case Value::kNone:
      out += "null";
      return;
    case Value::kBool:
      out += v.b ? "true" : "false";
      return;
    case Value::kInt:
      out += std::to_string(v.i);
      return;
    case Value::kFloat:
      out += std::isfinite(v.f) ? python_float(v.f)
             : std::isnan(v.f)  ? "NaN"
             : v.f > 0          ? "Infinity"
                                : "-Infinity";
      return;
    case Value::kString:
      return append_json_string(out, v.s(), style.ensure_ascii);
    case Value::kList:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) separate(style.item_separator);
        newline(depth + 1);
        append_json(out, (*v.list)[k], style, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    case Value::kMap: {
      if (v.map->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<size_t> order(v.map->items.size());
      for (size_t k = 0; k < order.size(); ++k) order[k] = k;
      if (style.sort_keys) {  // Python compares str by code point: UTF-8 bytes sort the same
        charge_steps(static_cast<int64_t>(order.size()));
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
          return v.map->items[a].first < v.map->items[b].first;
        });
      }
      out += '{';
      for (size_t k = 0; k < order.size(); ++k) {
        if (k) separate(style.item_separator);
        newline(depth + 1);
        append_json_string(out, v.map->items[order[k]].first, style.ensure_ascii);
        separate(style.key_separator);
        append_json(out, v.map->items[order[k]].second, style, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::kFunction:
      throw std::runtime_error("tojson: a function is not JSON");
  }
}
}  // namespace

std::string Value::str() const {
  switch (type) {
    case kUndefined:
      return "";
    case kNone:
      return "None";
    case kBool:
      return b ? "True" : "False";
    case kInt:
      return std::to_string(i);
    case kFloat:
      return python_float(f);
    case kString:
      charge_bytes(s().size());
      return s();
    default:
      return repr();
  }
}

std::string Value::repr() const {
  std::string out;
  append_repr(out, *this, 0);
  charge_bytes(out.size());
  return out;
}

std::string Value::to_json(const JsonStyle& style) const {
  std::string out;
  append_json(out, *this, style, 0);
  charge_bytes(out.size());
  return out;
}

const char* Value::type_name() const {
  static const char* const names[] = {"undefined", "none", "bool", "int",     "float",
                                      "string",    "list", "dict", "function"};
  return names[type];
}

bool equal(const Value& a, const Value& b, int depth) {
  check_value_depth(depth);
  charge_steps(1);
  if (a.is_number() && b.is_number()) {
    if (a.type == Value::kInt && b.type == Value::kInt) return a.i == b.i;  // exact past 2^53
    return a.number() == b.number();
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::kUndefined:
    case Value::kNone:
      return true;
    case Value::kString:
      charge_bytes(std::min(a.s().size(), b.s().size()));
      return a.s() == b.s();
    case Value::kList:
      if (a.list == b.list) return true;  // as Python compares a container with itself
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      return true;
    case Value::kMap:
      if (a.map == b.map) return true;
      if (a.map->items.size() != b.map->items.size()) return false;
      for (const auto& [k, v] : a.map->items) {
        const Value* w = b.map->find(k);
        if (!w || !equal(v, *w, depth + 1)) return false;
      }
      return true;
    default:
      return a.fn == b.fn;
  }
}

}  // namespace tightfit::jinja
