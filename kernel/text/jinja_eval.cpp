// Expressions of a chat template: literals, names, attributes, subscripts
// and slices, calls (host functions, macros, methods), filters, tests and
// Python's operators, each error given its place in the template.
#include <optional>

#include "jinja_builtins.hpp"
#include "jinja_operators.hpp"
#include "jinja_renderer.hpp"

namespace tightfit::jinja {

Args Renderer::arguments(const Expr& e) {
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

Value Renderer::slice(const Value& v, const Expr& e) {
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

Value Renderer::binary(const Expr& e) {
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

Value Renderer::eval(const Expr& e) {
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

Value Renderer::eval_soft(const Expr& e) {
  try {
    return eval(e);
  } catch (const std::runtime_error&) {
    return Value();
  }
}

}  // namespace tightfit::jinja
