// A chat template parsed once and rendered per conversation (the walk
// itself: jinja_renderer.hpp).
#include "chat_template.hpp"

#include <stdexcept>

#include "jinja_ast.hpp"
#include "jinja_renderer.hpp"
#include "jinja_value.hpp"

namespace tightfit {
namespace {

using jinja::Body;
using jinja::Node;
using jinja::Renderer;
using jinja::Value;

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
