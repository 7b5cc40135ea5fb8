// Statements of a chat template: text, output, if, for (with the loop
// variable and the per-message text spans), set, macros, loop controls and
// {% generation %} blocks.
#include "jinja_renderer.hpp"

#include "jinja_builtins.hpp"
#include "jinja_text.hpp"

namespace tightfit::jinja {
namespace {

// Bounds on what a hostile template can make the host do, beside the
// render's budget (jinja_budget.hpp).
constexpr int64_t kMaxIterations = 1'000'000;
constexpr int kMaxCallDepth = 64;

}  // namespace

Value Renderer::lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
    if (auto f = it->find(name); f != it->end()) return f->second;
  return jinja::global_function(name);
}

void Renderer::emit(const std::string& s) {
  if (out_.text.size() + s.size() > jinja::kMaxTextBytes)
    throw std::runtime_error(origin_ +
                             ": chat template: the template made a text of more "
                             "than 64 MiB (its output)");
  out_.text += s;
}

void Renderer::render(const Body& body, LoopControl& lc) {
  for (const auto& n : body) {
    render(*n, lc);
    if (lc.kind != LoopControl::kNone) return;
  }
}

void Renderer::render(const Node& n, LoopControl& lc) {
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

void Renderer::unpack(const std::vector<std::string>& targets, const Value& v,
                      const jinja::Where& w) {
  if (v.type != Value::kList || v.list->size() != targets.size())
    fail(w, "cannot unpack a " + std::string(v.type_name()) + " into " +
                std::to_string(targets.size()) + " names");
  for (size_t k = 0; k < targets.size(); ++k) scopes_.back()[targets[k]] = (*v.list)[k];
}

void Renderer::render_for(const Node& n, LoopControl& outer) {
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

void Renderer::record_message(const Value& item, size_t begin) {
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

void Renderer::bind(const Node& n, const Value& item) {
  if (n.targets.size() == 1)
    scopes_.back()[n.targets[0]] = item;
  else
    unpack(n.targets, item, n.where);
}

Value Renderer::make_macro(const Node& n) {
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

}  // namespace tightfit::jinja
