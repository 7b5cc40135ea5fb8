#include "jinja_value.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace tightfit::jinja {

const Value* Args::keyword(const std::string& name) const {
  for (const auto& [k, v] : keywords)
    if (k == name) return &v;
  return nullptr;
}

const Value* Map::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Map::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Value::of_list(List v) {
  Value x = with(kList);
  x.list = std::make_shared<List>(std::move(v));
  return x;
}

Value Value::of_map() {
  Value x = with(kMap);
  x.map = std::make_shared<Map>();
  return x;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
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
      for (const auto& e : j) l.push_back(from_json(e));
      return of_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value m = of_map();
      for (auto it = j.begin(); it != j.end(); ++it) m.map->set(it.key(), from_json(it.value()));
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
      return !s.empty();
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

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string python_string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char q = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
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
  return out + q;
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
      return s;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (type) {
    case kString:
      return python_string_repr(s);
    case kList: {
      std::string out = "[";
      for (size_t k = 0; k < list->size(); ++k) out += (k ? ", " : "") + (*list)[k].repr();
      return out + "]";
    }
    case kMap: {
      std::string out = "{";
      for (size_t k = 0; k < map->items.size(); ++k)
        out += (k ? ", " : "") + python_string_repr(map->items[k].first) + ": " +
               map->items[k].second.repr();
      return out + "}";
    }
    case kFunction:
      return "<function>";
    default:
      return str();
  }
}

std::string Value::to_json(int indent, int depth) const {
  if (depth > 100) throw std::runtime_error("tojson: a value nested deeper than 100 levels");
  const std::string pad =
      indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string end_pad =
      indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const std::string comma = indent > 0 ? "," : ", ";
  switch (type) {
    case kUndefined:
    case kNone:
      return "null";
    case kBool:
      return b ? "true" : "false";
    case kInt:
      return std::to_string(i);
    case kFloat:
      return std::isfinite(f) ? python_float(f)
                              : (std::isnan(f) ? "NaN"
                                 : f > 0       ? "Infinity"
                                               : "-Infinity");
    case kString:
      return json_string(s);
    case kList: {
      if (list->empty()) return "[]";
      std::string out = "[";
      for (size_t k = 0; k < list->size(); ++k)
        out += (k ? comma : "") + pad + (*list)[k].to_json(indent, depth + 1);
      return out + end_pad + "]";
    }
    case kMap: {
      if (map->items.empty()) return "{}";
      std::string out = "{";
      for (size_t k = 0; k < map->items.size(); ++k)
        out += (k ? comma : "") + pad + json_string(map->items[k].first) + ": " +
               map->items[k].second.to_json(indent, depth + 1);
      return out + end_pad + "}";
    }
    case kFunction:
      throw std::runtime_error("tojson: a function is not JSON");
  }
  return "null";
}

const char* Value::type_name() const {
  static const char* const names[] = {"undefined", "none", "bool", "int",     "float",
                                      "string",    "list", "dict", "function"};
  return names[type];
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::kUndefined:
    case Value::kNone:
      return true;
    case Value::kString:
      return a.s == b.s;
    case Value::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::kMap:
      if (a.map->items.size() != b.map->items.size()) return false;
      for (const auto& [k, v] : a.map->items) {
        const Value* w = b.map->find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    default:
      return a.fn == b.fn;
  }
}

}  // namespace tightfit::jinja
