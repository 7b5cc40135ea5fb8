// Renders a parsed chat template: scopes as Jinja keeps them (a for loop's
// assignments stay in the loop; namespace() objects are shared), Python's
// operators, the loop variable, macros, loop controls and generation spans.
#include "chat_template.hpp"

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "jinja_ast.hpp"
#include "jinja_budget.hpp"
#include "jinja_builtins.hpp"
#include "jinja_operators.hpp"
#include "jinja_text.hpp"
#include "jinja_value.hpp"

namespace tightfit {
namespace {

using jinja::Args;
using jinja::Body;
using jinja::Expr;
using jinja::List;
using jinja::Node;
using jinja::Value;

// Bounds on what a hostile template can make the host do, beside the
// render's budget (jinja_budget.hpp).
constexpr int64_t kMaxIterations = 1'000'000;
constexpr int kMaxCallDepth = 64;

struct LoopControl {
  enum Kind { kNone, kBreak, kContinue } kind = kNone;
};

class Renderer {
 public:
  Renderer(const std::string& origin, ChatRender& out) : origin_(origin), out_(out) {
    scopes_.emplace_back();
  }
  // A namespace that was assigned into may hold itself (ns.me = ns): its
  // entries are dropped when the render ends, so no cycle outlives it.
  ~Renderer() {
    for (const auto& m : assigned_) m->clear();
  }

  void set_global(const std::string& name, Value v) { scopes_.front()[name] = std::move(v); }

  // The messages are dicts the template's loops visit (also through
  // slices, filters and reversals, which share them): each one's text is
  // found by the dict's identity.
  void set_messages(const Value& messages) {
    set_global("messages", messages);
    out_.messages.assign(messages.list->size(), MessageText{});
    for (size_t k = 0; k < messages.list->size(); ++k)
      if ((*messages.list)[k].type == Value::kMap)
        message_index_[(*messages.list)[k].map.get()] = k;
  }

  void run(const Body& body) {
    LoopControl lc;
    render(body, lc);
  }

 private:
  [[noreturn]] void fail(const jinja::Where& w, const std::string& what) const {
    throw std::runtime_error(origin_ + ": chat template " + w.str() + ": " + what);
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(name); f != it->end()) return f->second;
    return jinja::global_function(name);
  }

  void emit(const std::string& s) {
    if (out_.text.size() + s.size() > jinja::kMaxTextBytes)
      throw std::runtime_error(origin_ +
                               ": chat template: the template made a text of more "
                               "than 64 MiB (its output)");
    out_.text += s;
  }

  // Nesting while rendering (blocks, expressions, macro calls), bounded so
  // the C++ stack is; every tag and expression is a step of the budget.
  struct Nested {
    Nested(Renderer& r, const jinja::Where& w) : r(r) {
      if (++r.depth_ > jinja::kMaxRenderDepth)
        r.fail(w,
               "rendering nested deeper than 1000 levels (macros that call each other too "
               "deep?)");
      try {
        jinja::charge_steps(1);
      } catch (const std::runtime_error& e) {
        --r.depth_;
        r.fail(w, e.what());
      }
    }
    ~Nested() { --r.depth_; }
    Renderer& r;
  };

  void render(const Body& body, LoopControl& lc) {
    for (const auto& n : body) {
      render(*n, lc);
      if (lc.kind != LoopControl::kNone) return;
    }
  }

  void render(const Node& n, LoopControl& lc) {
    const Nested nested(*this, n.where);
    switch (n.kind) {
      case Node::kText:
        return emit(n.text);
      case Node::kOutput:
        return emit(eval(*n.expr).str());
      case Node::kIf:
        for (size_t k = 0; k < n.conditions.size(); ++k)
          if (eval(*n.conditions[k]).truthy()) return render(n.bodies[k], lc);
        return render(n.else_body, lc);
      case Node::kFor:
        return render_for(n, lc);
      case Node::kSet: {
        Value v = eval(*n.expr);
        if (!n.attribute.empty()) {
          Value ns = lookup(n.targets[0]);
          if (ns.type != Value::kMap) fail(n.where, "'" + n.targets[0] + "' is not a namespace");
          assigned_.insert(ns.map);
          ns.map->set(n.attribute, std::move(v));
        } else if (n.targets.size() == 1) {
          scopes_.back()[n.targets[0]] = std::move(v);
        } else {
          unpack(n.targets, v, n.where);
        }
        return;
      }
      case Node::kSetBlock: {
        const size_t mark = out_.text.size();
        const Capturing capturing(*this);
        render(n.body, lc);
        std::string captured = out_.text.substr(mark);
        out_.text.resize(mark);
        scopes_.back()[n.targets[0]] =
            at_place(n.where, [&] { return Value::string(std::move(captured)); });
        return;
      }
      case Node::kGeneration: {
        const size_t begin = out_.text.size();
        render(n.body, lc);
        out_.generation_spans.emplace_back(begin, out_.text.size());
        return;
      }
      case Node::kBreak:
        lc.kind = LoopControl::kBreak;
        return;
      case Node::kContinue:
        lc.kind = LoopControl::kContinue;
        return;
      case Node::kMacro:
        scopes_.back()[n.text] = make_macro(n);
        return;
    }
  }

  void unpack(const std::vector<std::string>& targets, const Value& v, const jinja::Where& w) {
    if (v.type != Value::kList || v.list->size() != targets.size())
      fail(w, "cannot unpack a " + std::string(v.type_name()) + " into " +
                  std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) scopes_.back()[targets[k]] = (*v.list)[k];
  }

  void render_for(const Node& n, LoopControl& outer) {
    Value seq = eval(*n.expr);
    List items;
    if (seq.type == Value::kList)
      items = *seq.list;
    else if (seq.type == Value::kMap)
      for (const auto& [k, v] : seq.map->items) items.push_back(Value::string(k));
    else if (seq.type == Value::kString) {
      const jinja::CodePoints chars(seq.s());
      for (int64_t k = 0; k < chars.size(); ++k)
        items.push_back(at_place(n.where, [&] { return Value::string(std::string(chars.at(k))); }));
    } else if (seq.defined() && seq.type != Value::kNone)
      fail(n.where, std::string("cannot loop over a ") + seq.type_name());
    scopes_.emplace_back();
    if (n.filter) {  // {% for x in xs if cond %}: the loop sees only the kept items
      List kept;
      for (const Value& item : items) {
        bind(n, item);
        if (eval(*n.filter).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    // One loop object, updated in place as Jinja's LoopContext is.
    static const char* const kLoopKeys[] = {"index", "index0", "revindex", "revindex0", "first",
                                            "last",  "length", "previtem", "nextitem"};
    Value loop = Value::of_map();
    for (const char* key : kLoopKeys) loop.map->set(key, Value());
    scopes_.back()["loop"] = loop;
    for (int64_t k = 0; k < len; ++k) {
      if (++iterations_ > kMaxIterations) fail(n.where, "more than 1,000,000 loop iterations");
      bind(n, items[static_cast<size_t>(k)]);
      auto& entries = loop.map->items;  // in kLoopKeys' order
      entries[0].second = Value::integer(k + 1);
      entries[1].second = Value::integer(k);
      entries[2].second = Value::integer(len - k);
      entries[3].second = Value::integer(len - k - 1);
      entries[4].second = Value::boolean(k == 0);
      entries[5].second = Value::boolean(k == len - 1);
      entries[6].second = Value::integer(len);
      entries[7].second = k > 0 ? items[static_cast<size_t>(k - 1)] : Value();
      entries[8].second = k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value();
      LoopControl lc;
      const size_t begin = out_.text.size();
      render(n.body, lc);
      record_message(items[static_cast<size_t>(k)], begin);
      if (lc.kind == LoopControl::kBreak) break;
    }
    if (len == 0) render(n.else_body, outer);
    scopes_.pop_back();
  }

  // Text written while a macro or {% set %} block captures it is cut off
  // the output again: no message's place is taken from it.
  struct Capturing {
    explicit Capturing(Renderer& r) : r(r) { ++r.capturing_; }
    ~Capturing() { --r.capturing_; }
    Renderer& r;
  };

  void record_message(const Value& item, size_t begin) {
    if (item.type != Value::kMap || capturing_ > 0) return;
    const auto found = message_index_.find(item.map.get());
    if (found == message_index_.end()) return;
    MessageText& m = out_.messages[found->second];
    ++m.loops;
    if (out_.text.size() == begin) return;
    if (m.writers++ == 0) {
      m.begin = begin;
      m.end = out_.text.size();
    }
  }

  void bind(const Node& n, const Value& item) {
    if (n.targets.size() == 1)
      scopes_.back()[n.targets[0]] = item;
    else
      unpack(n.targets, item, n.where);
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value::function([this, node](const Args& a) {
      if (++call_depth_ > kMaxCallDepth) fail(node->where, "macros call each other too deep");
      scopes_.emplace_back();
      for (size_t k = 0; k < node->params.size(); ++k) {
        Value v;
        if (k < a.positional.size())
          v = a.positional[k];
        else if (const Value* kw = a.keyword(node->params[k]))
          v = *kw;
        else if (node->defaults[k])
          v = eval(*node->defaults[k]);
        scopes_.back()[node->params[k]] = v;
      }
      const size_t mark = out_.text.size();
      LoopControl lc;
      {
        const Capturing capturing(*this);
        render(node->body, lc);
      }
      std::string text = out_.text.substr(mark);
      out_.text.resize(mark);
      scopes_.pop_back();
      --call_depth_;
      return at_place(node->where, [&] { return Value::string(std::move(text)); });
    });
  }

  Args arguments(const Expr& e) {
    Args a;
    for (size_t k = 0; k < e.args.size(); ++k) {
      Value v = eval(*e.args[k]);
      if (k < e.kwarg_names.size() && !e.kwarg_names[k].empty())
        a.keywords.emplace_back(e.kwarg_names[k], std::move(v));
      else
        a.positional.push_back(std::move(v));
    }
    return a;
  }

  // Python's operators (jinja_operators.cpp), their errors given the place.
  template <typename F>
  Value at_place(const jinja::Where& w, F&& f) {
    try {
      return f();
    } catch (const std::runtime_error& x) {
      fail(w, x.what());
    }
  }

  Value slice(const Value& v, const Expr& e) {
    auto bound = [&](const jinja::ExprPtr& p) -> std::optional<int64_t> {
      if (!p) return std::nullopt;
      const Value b = eval(*p);
      if (b.type == Value::kNone) return std::nullopt;
      if (b.type != Value::kInt) fail(e.where, "slice bounds must be integers");
      return b.i;
    };
    const auto start = bound(e.b), stop = bound(e.c);
    const auto step = e.args.empty() ? std::nullopt : bound(e.args[0]);
    return at_place(e.where, [&] { return jinja::slice(v, start, stop, step.value_or(1)); });
  }

  Value binary(const Expr& e) {
    const std::string& op = e.text;
    if (op == "and") {
      Value a = eval(*e.a);
      return a.truthy() ? eval(*e.b) : a;
    }
    if (op == "or") {
      Value a = eval(*e.a);
      return a.truthy() ? a : eval(*e.b);
    }
    const Value a = eval(*e.a), b = eval(*e.b);
    return at_place(e.where, [&] { return jinja::binary_operator(op, a, b); });
  }

  Value eval(const Expr& e) {
    const Nested nested(*this, e.where);
    switch (e.kind) {
      case Expr::kLiteral:
        switch (e.literal_kind) {
          case Expr::kNone:
            return Value::none();
          case Expr::kBool:
            return Value::boolean(!e.text.empty());
          case Expr::kInt:
            return Value::integer(e.int_value);
          case Expr::kFloat:
            return Value::real(e.float_value);
          case Expr::kString:
            return at_place(e.where, [&] { return Value::string(e.text); });
        }
        return Value();
      case Expr::kName:
        return lookup(e.text);
      case Expr::kList:
      case Expr::kTuple: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return at_place(e.where, [&] { return Value::of_list(std::move(l)); });
      }
      case Expr::kDict: {
        Value m = Value::of_map();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          std::string name = at_place(e.where, [&] { return Value::string(key.str()); }).s();
          m.map->set(name, eval(*e.args[k + 1]));
        }
        return m;
      }
      case Expr::kAttribute: {
        const Value v = eval(*e.a);
        if (v.type == Value::kMap) {
          const Value* x = v.map->find(e.text);
          return x ? *x : Value();
        }
        if (!v.defined()) fail(e.where, "'" + e.text + "' of an undefined value");
        return Value();  // a method, resolved by the call around it
      }
      case Expr::kSubscript: {
        const Value v = eval(*e.a), key = eval(*e.b);
        return at_place(e.where, [&] { return jinja::subscript(v, key); });
      }
      case Expr::kSlice:
        return slice(eval(*e.a), e);
      case Expr::kCall: {
        Args args = arguments(e);
        if (e.a->kind == Expr::kAttribute) {  // a method: "x".strip(), d.get(k)
          const Value self = eval(*e.a->a);
          if (self.type == Value::kMap)
            if (const Value* f = self.map->find(e.a->text); f && f->type == Value::kFunction)
              return (*f->fn)(args);
          try {
            return jinja::call_method(self, e.a->text, args);
          } catch (const std::runtime_error& x) {
            fail(e.where, x.what());
          }
        }
        const Value f = eval(*e.a);
        if (f.type != Value::kFunction)
          fail(e.where, e.a->kind == Expr::kName
                            ? "'" + e.a->text + "' is not a function this host offers"
                            : std::string("a ") + f.type_name() + " is not callable");
        try {
          return (*f.fn)(args);
        } catch (const std::runtime_error& x) {
          const std::string what = x.what();
          if (what.rfind(origin_, 0) == 0) throw;
          fail(e.where, what);
        }
      }
      case Expr::kFilter: {
        const Value v = eval(*e.a);
        const Args args = arguments(e);
        try {
          return jinja::apply_filter(e.text, v, args);
        } catch (const std::runtime_error& x) {
          fail(e.where, x.what());
        }
      }
      case Expr::kTest: {
        const Value v = e.text == "defined" || e.text == "undefined" ? eval_soft(*e.a) : eval(*e.a);
        const Args args = arguments(e);
        try {
          return Value::boolean(jinja::apply_test(e.text, v, args) != e.negated);
        } catch (const std::runtime_error& x) {
          fail(e.where, x.what());
        }
      }
      case Expr::kUnary: {
        const Value v = eval(*e.a);
        if (e.text == "not") return Value::boolean(!v.truthy());
        if (v.type == Value::kInt && e.text == "-" && v.i == INT64_MIN)
          fail(e.where, "the integer result of unary - does not fit 64 bits");
        if (v.type == Value::kInt) return Value::integer(e.text == "-" ? -v.i : v.i);
        if (v.type == Value::kFloat) return Value::real(e.text == "-" ? -v.f : v.f);
        fail(e.where, "unary " + e.text + " of a " + v.type_name());
      }
      case Expr::kBinary:
        return binary(e);
      case Expr::kTernary:
        return eval(*e.b).truthy() ? eval(*e.a) : (e.c ? eval(*e.c) : Value());
    }
    return Value();
  }

  // "x.y is defined" asks; it must not fail when x itself is undefined.
  Value eval_soft(const Expr& e) {
    try {
      return eval(e);
    } catch (const std::runtime_error&) {
      return Value();
    }
  }

  const std::string& origin_;
  ChatRender& out_;
  std::vector<std::map<std::string, Value>> scopes_;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
  int depth_ = 0;
  int capturing_ = 0;
  std::set<std::shared_ptr<jinja::Map>> assigned_;
  std::unordered_map<const jinja::Map*, size_t> message_index_;
};

bool uses_generation(const Body& body) {
  for (const auto& n : body) {
    if (n->kind == Node::kGeneration) return true;
    if (uses_generation(n->body) || uses_generation(n->else_body)) return true;
    for (const auto& b : n->bodies)
      if (uses_generation(b)) return true;
  }
  return false;
}

}  // namespace

struct ChatTemplate::Tree {
  Body body;
};

ChatTemplate::ChatTemplate(const std::string& source, const std::string& origin)
    : tree_(std::make_unique<Tree>()), origin_(origin) {
  tree_->body = jinja::parse(source, origin);
  has_generation_ = uses_generation(tree_->body);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;

ChatRender ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                const nlohmann::ordered_json& variables) const {
  ChatRender out;
  jinja::reset_budget();
  try {
    Renderer r(origin_, out);
    for (auto it = variables.begin(); it != variables.end(); ++it)
      r.set_global(it.key(), Value::from_json(it.value()));
    const Value list = Value::from_json(messages);
    if (list.type != Value::kList) throw std::runtime_error("messages must be a list");
    r.set_messages(list);
    r.set_global("add_generation_prompt", Value::boolean(add_generation_prompt));
    r.run(tree_->body);
  } catch (const std::runtime_error& e) {
    // Every error names the file: one from reading the context has no place.
    if (std::string(e.what()).rfind(origin_, 0) == 0) throw;
    throw std::runtime_error(origin_ + ": chat template: " + e.what());
  }
  return out;
}

}  // namespace tightfit
