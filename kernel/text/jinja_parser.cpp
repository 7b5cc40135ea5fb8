// Jinja's parser for chat templates: statements (if, for, set, macro, the
// {% generation %} tag, loop controls) and expressions with Jinja 3's
// precedence, over the lexer's segments and tokens.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <vector>

#include "jinja_ast.hpp"
#include "jinja_lexer.hpp"

namespace tightfit::jinja {
namespace {

// Templates nest a handful of levels; hostile ones are refused, not recursed into.
constexpr int kMaxNesting = 200;

class Parser {
 public:
  Parser(std::vector<Segment> segs, const std::string& origin)
      : segs_(std::move(segs)), origin_(origin) {}

  Body parse_all() {
    Body body = parse_body({}, nullptr);
    return body;
  }

 private:
  // ---- statements --------------------------------------------------------
  // Parses nodes until a block tag whose first word is in `ends`; that word
  // goes to *ended (and its tokens stay in toks_ for the caller).
  Body parse_body(const std::set<std::string>& ends, std::string* ended) {
    if (++depth_ > kMaxNesting) fail(Where{}, "blocks nested deeper than 200 levels");
    Body body;
    while (seg_ < segs_.size()) {
      const Segment& s = segs_[seg_++];
      if (s.kind == Segment::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::kText;
        n->text = s.text;
        n->where = s.where;
        body.push_back(std::move(n));
        continue;
      }
      toks_ = tokenize(s.text, s.where, origin_);
      at_ = 0;
      if (s.kind == Segment::kVar) {
        auto n = std::make_unique<Node>();
        n->kind = Node::kOutput;
        n->where = s.where;
        n->expr = expression();
        expect_end();
        body.push_back(std::move(n));
        continue;
      }
      const Token& head = peek();
      if (head.kind != Token::kName) fail(head.where, "a block tag must start with a keyword");
      if (ends.count(head.text)) {
        if (ended) *ended = head.text;
        --depth_;
        return body;
      }
      body.push_back(statement());
    }
    if (!ends.empty()) {
      std::string closer = *ends.begin();
      for (const auto& e : ends)
        if (e.rfind("end", 0) == 0) closer = e;
      fail(segs_.empty() ? Where{} : segs_.back().where,
           "the template ends inside a block: {% " + closer + " %} is missing");
    }
    --depth_;
    return body;
  }

  NodePtr statement() {
    const Token head = next();
    auto n = std::make_unique<Node>();
    n->where = head.where;
    const std::string& kw = head.text;
    if (kw == "if") {
      n->kind = Node::kIf;
      n->conditions.push_back(expression());
      expect_end();
      for (;;) {
        std::string ended;
        n->bodies.push_back(parse_body({"elif", "else", "endif"}, &ended));
        next();
        if (ended == "elif") {
          n->conditions.push_back(expression());
          expect_end();
        } else if (ended == "else") {
          expect_end();
          n->else_body = parse_body({"endif"}, &ended);
          next();
          expect_end();
          break;
        } else {
          expect_end();
          break;
        }
      }
    } else if (kw == "for") {
      n->kind = Node::kFor;
      n->targets.push_back(name());
      while (accept_op(",")) n->targets.push_back(name());
      expect_name("in");
      n->expr = or_expr();  // a ternary would swallow the loop filter's "if"
      if (accept_name("if")) n->filter = or_expr();
      if (accept_name("recursive")) fail(head.where, "recursive for loops are not supported");
      expect_end();
      std::string ended;
      n->body = parse_body({"else", "endfor"}, &ended);
      next();
      expect_end();
      if (ended == "else") {
        n->else_body = parse_body({"endfor"}, &ended);
        next();
        expect_end();
      }
    } else if (kw == "set") {
      const std::string target = name();
      if (accept_op(".")) {
        n->kind = Node::kSet;
        n->targets.push_back(target);
        n->attribute = name();
      } else if (peek().kind == Token::kEnd) {  // {% set x %}...{% endset %}
        n->kind = Node::kSetBlock;
        n->targets.push_back(target);
        expect_end();
        std::string ended;
        n->body = parse_body({"endset"}, &ended);
        next();
        expect_end();
        return n;
      } else {
        n->kind = Node::kSet;
        n->targets.push_back(target);
        while (accept_op(",")) n->targets.push_back(name());
      }
      expect_op("=");
      n->expr = expression();
      expect_end();
    } else if (kw == "generation") {
      n->kind = Node::kGeneration;
      expect_end();
      std::string ended;
      n->body = parse_body({"endgeneration"}, &ended);
      next();
      expect_end();
    } else if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::kBreak : Node::kContinue;
      expect_end();
    } else if (kw == "macro") {
      n->kind = Node::kMacro;
      n->text = name();
      expect_op("(");
      while (!accept_op(")")) {
        n->params.push_back(name());
        n->defaults.push_back(accept_op("=") ? expression() : nullptr);
        if (!accept_op(",")) {
          expect_op(")");
          break;
        }
      }
      expect_end();
      std::string ended;
      n->body = parse_body({"endmacro"}, &ended);
      next();
      expect_end();
    } else {
      fail(head.where, "the statement {% " + kw +
                           " %} is not supported (if, for, set, macro, generation, break, "
                           "continue)");
    }
    return n;
  }

  // ---- expressions -------------------------------------------------------
  ExprPtr make(Expr::Kind k, Where w) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->where = w;
    return e;
  }
  // A node whose children are set: its height, bounded. Chains (a + b + c,
  // x.a.b, x|f|g, not not x) grow the tree without the parser recursing, so
  // the height is what bounds evaluating and freeing it.
  ExprPtr done(ExprPtr e) {
    int tallest = 0;
    for (const ExprPtr* child : {&e->a, &e->b, &e->c})
      if (*child) tallest = std::max(tallest, (*child)->height);
    for (const auto& arg : e->args)
      if (arg) tallest = std::max(tallest, arg->height);
    e->height = tallest + 1;
    if (e->height > kMaxNesting) fail(e->where, "expression nested deeper than 200 levels");
    return e;
  }

  ExprPtr expression() {  // ternary: a if cond else b
    // Parentheses, lists and subscripts recurse through here: bound the depth.
    struct Depth {
      int& d;
      ~Depth() { --d; }
    } guard{depth_};
    if (++depth_ > kMaxNesting) fail(peek().where, "expression nested deeper than 200 levels");
    ExprPtr value = or_expr();
    while (peek().kind == Token::kName && peek().text == "if") {
      auto t = make(Expr::kTernary, next().where);
      t->b = or_expr();
      if (accept_name("else")) t->c = expression();
      t->a = std::move(value);
      value = done(std::move(t));
    }
    return value;
  }
  ExprPtr binary_chain(ExprPtr (Parser::*sub)(), std::initializer_list<const char*> ops,
                       bool names) {
    ExprPtr left = (this->*sub)();
    for (;;) {
      const Token& t = peek();
      bool hit = false;
      for (const char* op : ops)
        if ((names ? t.kind == Token::kName : t.kind == Token::kOp) && t.text == op) hit = true;
      if (!hit) return left;
      auto e = make(Expr::kBinary, next().where);
      e->text = t.text;
      e->a = std::move(left);
      e->b = (this->*sub)();
      left = done(std::move(e));
    }
  }
  ExprPtr or_expr() { return binary_chain(&Parser::and_expr, {"or"}, true); }
  ExprPtr and_expr() { return binary_chain(&Parser::not_expr, {"and"}, true); }
  ExprPtr not_expr() {  // not not x: a loop, not a recursion per "not"
    std::vector<Where> nots;
    while (peek().kind == Token::kName && peek().text == "not") nots.push_back(next().where);
    ExprPtr value = compare();
    for (auto w = nots.rbegin(); w != nots.rend(); ++w) {
      auto e = make(Expr::kUnary, *w);
      e->text = "not";
      e->a = std::move(value);
      value = done(std::move(e));
    }
    return value;
  }
  ExprPtr compare() {
    ExprPtr left = concat();
    for (;;) {
      const Token& t = peek();
      std::string op;
      if (t.kind == Token::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                   t.text == ">" || t.text == "<=" || t.text == ">="))
        op = t.text;
      else if (t.kind == Token::kName && t.text == "in")
        op = "in";
      else if (t.kind == Token::kName && t.text == "not" && peek(1).kind == Token::kName &&
               peek(1).text == "in")
        op = "not in";
      if (op.empty()) return left;
      auto e = make(Expr::kBinary, next().where);
      if (op == "not in") next();
      e->text = op;
      e->a = std::move(left);
      e->b = concat();
      left = done(std::move(e));
    }
  }
  ExprPtr concat() { return binary_chain(&Parser::add, {"~"}, false); }
  ExprPtr add() { return binary_chain(&Parser::mul, {"+", "-"}, false); }
  ExprPtr mul() { return binary_chain(&Parser::unary, {"*", "/", "//", "%"}, false); }
  ExprPtr unary() {  // - - x: a loop, not a recursion per sign
    std::vector<Token> signs;
    while (peek().kind == Token::kOp && (peek().text == "-" || peek().text == "+"))
      signs.push_back(next());
    // Jinja: a sign takes the value with its attributes, items and calls;
    // filters and tests then apply to the signed value (-x|abs is abs(-x)).
    ExprPtr value = postfix(primary(), /*filters=*/signs.empty());
    if (signs.empty()) return value;
    for (auto t = signs.rbegin(); t != signs.rend(); ++t) {
      auto e = make(Expr::kUnary, t->where);
      e->text = t->text;
      e->a = std::move(value);
      value = done(std::move(e));
    }
    return postfix(std::move(value));
  }

  ExprPtr postfix(ExprPtr e, bool filters = true) {
    if (++depth_ > kMaxNesting) fail(peek().where, "expression nested deeper than 200 levels");
    for (;;) {
      const Token& t = peek();
      if (t.kind == Token::kOp && t.text == ".") {
        auto a = make(Expr::kAttribute, next().where);
        a->text = peek().kind == Token::kInt ? next().text : name();
        a->a = std::move(e);
        e = done(std::move(a));
      } else if (t.kind == Token::kOp && t.text == "[") {
        const Where w = next().where;
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!(peek().kind == Token::kOp && (peek().text == ":" || peek().text == "]")))
            parts[k] = expression();
          if (k < 2 && accept_op(":")) {
            slice = true;
            continue;
          }
          break;
        }
        expect_op("]");
        if (!slice && !parts[0]) fail(w, "an empty subscript []");  // found by fuzz_chat_template
        auto s = make(slice ? Expr::kSlice : Expr::kSubscript, w);
        s->a = std::move(e);
        s->b = std::move(parts[0]);
        s->c = std::move(parts[1]);
        if (parts[2]) s->args.push_back(std::move(parts[2]));
        e = done(std::move(s));
      } else if (t.kind == Token::kOp && t.text == "(") {
        auto c = make(Expr::kCall, next().where);
        c->a = std::move(e);
        arguments(*c);
        e = done(std::move(c));
      } else if (filters && t.kind == Token::kOp && t.text == "|") {
        auto f = make(Expr::kFilter, next().where);
        f->text = name();
        f->a = std::move(e);
        if (accept_op("(")) arguments(*f);
        e = done(std::move(f));
      } else if (filters && t.kind == Token::kName && t.text == "is") {
        auto f = make(Expr::kTest, next().where);
        f->negated = accept_name("not");
        f->text = peek().kind == Token::kName &&
                          (peek().text == "none" || peek().text == "true" || peek().text == "false")
                      ? next().text
                      : name();
        f->a = std::move(e);
        if (accept_op("("))
          arguments(*f);
        else if (peek().kind == Token::kString || peek().kind == Token::kInt)
          f->args.push_back(primary());  // "is divisibleby 3", "is eq 'x'"
        e = done(std::move(f));
      } else {
        --depth_;
        return e;
      }
    }
  }

  void arguments(Expr& call) {  // after "(": expr, name=expr, ... ")"
    while (!accept_op(")")) {
      std::string kw;
      if (peek().kind == Token::kName && peek(1).kind == Token::kOp && peek(1).text == "=") {
        kw = next().text;
        next();
      }
      call.args.push_back(expression());
      call.kwarg_names.push_back(kw);
      if (!accept_op(",")) {
        expect_op(")");
        return;
      }
    }
  }

  ExprPtr primary() {
    const Token t = next();
    if (t.kind == Token::kString) {
      auto e = make(Expr::kLiteral, t.where);
      e->literal_kind = Expr::kString;
      e->text = t.text;
      while (peek().kind == Token::kString) e->text += next().text;  // "a" "b" is "ab"
      return e;
    }
    if (t.kind == Token::kInt || t.kind == Token::kFloat) {
      auto e = make(Expr::kLiteral, t.where);
      e->literal_kind = t.kind == Token::kInt ? Expr::kInt : Expr::kFloat;
      e->text = t.text;
      if (t.kind == Token::kInt) {
        const char* end = t.text.data() + t.text.size();
        const auto [p, ec] = std::from_chars(t.text.data(), end, e->int_value);
        if (ec != std::errc() || p != end)  // Python's integers are unbounded; these are not
          fail(t.where, "the integer " + t.text.substr(0, 40) + " does not fit 64 bits");
      } else {
        e->float_value = std::strtod(t.text.c_str(), nullptr);  // too big is inf, as Python
      }
      return e;
    }
    if (t.kind == Token::kName) {
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        auto e = make(Expr::kLiteral, t.where);
        e->literal_kind = Expr::kBool;
        e->text = (t.text == "true" || t.text == "True") ? "1" : "";
        return e;
      }
      if (t.text == "none" || t.text == "None") return make(Expr::kLiteral, t.where);
      auto e = make(Expr::kName, t.where);
      e->text = t.text;
      return e;
    }
    if (t.kind == Token::kOp && t.text == "(") {
      ExprPtr first = accept_op(")") ? nullptr : expression();
      if (first && accept_op(")")) return first;  // (x): x itself, no taller
      auto tuple = make(Expr::kTuple, t.where);
      if (first) tuple->args.push_back(std::move(first));
      while (accept_op(",")) {
        if (peek().kind == Token::kOp && peek().text == ")") break;
        tuple->args.push_back(expression());
      }
      if (!tuple->args.empty()) expect_op(")");
      return done(std::move(tuple));
    }
    if (t.kind == Token::kOp && t.text == "[") {
      auto list = make(Expr::kList, t.where);
      while (!accept_op("]")) {
        list->args.push_back(expression());
        if (!accept_op(",")) {
          expect_op("]");
          break;
        }
      }
      return done(std::move(list));
    }
    if (t.kind == Token::kOp && t.text == "{") {
      auto dict = make(Expr::kDict, t.where);
      while (!accept_op("}")) {
        dict->args.push_back(expression());
        expect_op(":");
        dict->args.push_back(expression());
        if (!accept_op(",")) {
          expect_op("}");
          break;
        }
      }
      return done(std::move(dict));
    }
    fail(t.where, t.kind == Token::kEnd ? "an expression ends too early"
                                        : "unexpected '" + t.text + "' in an expression");
  }

  // ---- tokens ------------------------------------------------------------
  const Token& peek(size_t ahead = 0) const {
    return toks_[std::min(at_ + ahead, toks_.size() - 1)];
  }
  Token next() {
    const Token t = peek();
    if (at_ < toks_.size() - 1) ++at_;
    return t;
  }
  bool accept_op(const char* op) {
    if (peek().kind == Token::kOp && peek().text == op) return next(), true;
    return false;
  }
  bool accept_name(const char* n) {
    if (peek().kind == Token::kName && peek().text == n) return next(), true;
    return false;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(peek().where, std::string("expected '") + op + "'");
  }
  void expect_name(const char* n) {
    if (!accept_name(n)) fail(peek().where, std::string("expected '") + n + "'");
  }
  std::string name() {
    if (peek().kind != Token::kName) fail(peek().where, "expected a name");
    return next().text;
  }
  void expect_end() {
    if (peek().kind != Token::kEnd)
      fail(peek().where, "unexpected '" + peek().text + "' at the end of a tag");
  }
  [[noreturn]] void fail(Where w, const std::string& what) const {
    throw std::invalid_argument(origin_ + ": chat template " + w.str() + ": " + what);
  }

  std::vector<Segment> segs_;
  const std::string& origin_;
  size_t seg_ = 0;
  std::vector<Token> toks_;
  size_t at_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(const std::string& source, const std::string& origin) {
  Parser parser(segments(source, origin), origin);
  return parser.parse_all();
}

}  // namespace tightfit::jinja
