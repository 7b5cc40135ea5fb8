// The chat-template interpreter's walk over a parsed template: scopes as
// Jinja keeps them (a for loop's assignments stay in the loop; namespace()
// objects are shared), Python's operators, the loop variable, macros, loop
// controls and generation spans. Statements are rendered in
// jinja_renderer.cpp, expressions evaluated in jinja_eval.cpp.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat_render.hpp"
#include "jinja_ast.hpp"
#include "jinja_budget.hpp"
#include "jinja_value.hpp"

namespace tightfit::jinja {

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

  Value lookup(const std::string& name) const;

  void emit(const std::string& s);

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

  void render(const Body& body, LoopControl& lc);

  void render(const Node& n, LoopControl& lc);

  void unpack(const std::vector<std::string>& targets, const Value& v, const jinja::Where& w);

  void render_for(const Node& n, LoopControl& outer);

  // Text written while a macro or {% set %} block captures it is cut off
  // the output again: no message's place is taken from it.
  struct Capturing {
    explicit Capturing(Renderer& r) : r(r) { ++r.capturing_; }
    ~Capturing() { --r.capturing_; }
    Renderer& r;
  };

  void record_message(const Value& item, size_t begin);

  void bind(const Node& n, const Value& item);

  Value make_macro(const Node& n);

  Args arguments(const Expr& e);

  // Python's operators (jinja_operators.cpp), their errors given the place.
  template <typename F>
  Value at_place(const jinja::Where& w, F&& f) {
    try {
      return f();
    } catch (const std::runtime_error& x) {
      fail(w, x.what());
    }
  }

  Value slice(const Value& v, const Expr& e);

  Value binary(const Expr& e);

  Value eval(const Expr& e);

  // "x.y is defined" asks; it must not fail when x itself is undefined.
  Value eval_soft(const Expr& e);

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

}  // namespace tightfit::jinja
