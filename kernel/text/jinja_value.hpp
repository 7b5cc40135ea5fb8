// Values of the Jinja subset chat templates use, with Python's semantics for
// truth, equality, printing and json.dumps (internal to chat_template).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tightfit::jinja {

struct Value;
using List = std::vector<Value>;
struct Map;
// Arguments of a call: positional, then keyword (name, value).
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
  const Value* keyword(const std::string& name) const;
};
using Function = std::function<Value(const Args&)>;

// json.dumps' options, as transformers' tojson filter passes them on.
struct JsonStyle {
  bool ensure_ascii = false;  // non-ASCII as \uXXXX escapes
  bool pretty = false;        // indent is not None: each item on its own line
  std::string indent;         // the text each level of nesting adds to a line
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false;
};

struct Value {
  enum Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kMap, kFunction };
  Type type = kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> text;  // shared: looking a string up never copies it
  std::shared_ptr<List> list;
  std::shared_ptr<Map> map;  // dicts, and namespace() objects (shared, mutable)
  std::shared_ptr<Function> fn;

  static Value none() { return with(kNone); }
  static Value boolean(bool v) {
    Value x = with(kBool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = with(kInt);
    x.i = v;
    return x;
  }
  static Value real(double v) {
    Value x = with(kFloat);
    x.f = v;
    return x;
  }
  // Charged to the render's budget (jinja_budget.hpp).
  static Value string(std::string v);
  static Value of_list(List v);
  static Value of_map();
  static Value function(Function f) {
    Value x = with(kFunction);
    x.fn = std::make_shared<Function>(std::move(f));
    return x;
  }
  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);

  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  // Lists and dicts nested a million deep are freed one level at a time, not
  // by a recursion as deep as they are.
  ~Value();

  const std::string& s() const;  // the text of a string ("" for any other value)

  bool defined() const { return type != kUndefined; }
  bool truthy() const;
  bool is_number() const { return type == kInt || type == kFloat || type == kBool; }
  double number() const { return type == kFloat ? f : type == kInt ? static_cast<double>(i) : b; }
  // Printing and converting are bounded: kMaxValueDepth levels, kMaxTextBytes.
  std::string str() const;                            // as {{ value }} prints it (Python's str)
  std::string repr() const;                           // Python's repr, for lists and dicts
  std::string to_json(const JsonStyle& style) const;  // json.dumps with these options
  const char* type_name() const;

 private:
  static Value with(Type t) {
    Value v;
    v.type = t;
    return v;
  }
};

struct Map {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python's dicts
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
  void clear() {
    items.clear();
    index_.clear();
  }

 private:
  // key -> place in items, kept once a dict is big (a row's object with
  // 100,000 keys is read in linear time, not quadratic).
  std::unordered_map<std::string, size_t> index_;
};

bool equal(const Value& a, const Value& b, int depth = 0);

}  // namespace tightfit::jinja
