// Jinja's lexer and parser for chat templates, with the settings transformers
// renders them with (trim_blocks, lstrip_blocks, loop controls, the
// {% generation %} tag). Whitespace control and precedence follow Jinja 3.
#include <cctype>
#include <set>
#include <stdexcept>

#include "jinja_ast.hpp"

namespace tightfit::jinja {
namespace {

// Templates nest a handful of levels; hostile ones are refused, not recursed into.
constexpr int kMaxNesting = 200;

struct Token {
  enum Kind { kName, kString, kInt, kFloat, kOp, kEnd } kind;
  std::string text;
  Where where;
};

// A tag or a run of text, after whitespace control.
struct Segment {
  enum Kind { kText, kVar, kBlock } kind;
  std::string text;  // the text, or the tag's inside
  Where where;
};

Where where_at(const std::string& s, size_t pos) {
  Where w;
  for (size_t i = 0; i < pos && i < s.size(); ++i) {
    if (s[i] == '\n') {
      ++w.line;
      w.column = 1;
    } else {
      ++w.column;
    }
  }
  return w;
}

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& origin) : src_(src), origin_(origin) {}

  std::vector<Segment> segments() {
    std::vector<Segment> out;
    size_t pos = 0;
    bool strip_next = false, trim_newline = false;
    bool line_starting = true;  // the text begins a line (lstrip_blocks may strip its indent)
    const char* const ws = " \t\r\n";
    while (pos <= src_.size()) {
      const size_t open = find_open(pos);
      std::string text = src_.substr(pos, open - pos);
      if (strip_next) {  // "-%}": whitespace after the tag goes
        const size_t keep = std::min(text.find_first_not_of(ws), text.size());
        line_starting = keep > 0 && text[keep - 1] == '\n' ? true : line_starting;
        text.erase(0, keep);
      } else if (trim_newline && text.compare(0, 1, "\n") == 0) {  // trim_blocks
        text.erase(0, 1);
        line_starting = true;
      } else if (trim_newline && text.compare(0, 2, "\r\n") == 0) {
        text.erase(0, 2);
        line_starting = true;
      }
      if (open == src_.size()) {
        if (!text.empty()) out.push_back({Segment::kText, text, where_at(src_, pos)});
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      const bool minus = open + 2 < src_.size() && src_[open + 2] == '-';
      const bool plus = open + 2 < src_.size() && src_[open + 2] == '+';
      if (minus) {  // "{%-": whitespace before the tag goes
        const size_t last = text.find_last_not_of(ws);
        text.erase(last == std::string::npos ? 0 : last + 1);
      } else if (kind != '{' && !plus) {  // lstrip_blocks: a block tag's indent goes
        const size_t nl = text.find_last_of('\n');
        const size_t line_start = nl == std::string::npos ? 0 : nl + 1;
        if ((nl != std::string::npos || line_starting) &&
            text.find_first_not_of(" \t", line_start) == std::string::npos)
          text.erase(line_start);
      }
      if (!text.empty()) out.push_back({Segment::kText, text, where_at(src_, pos)});
      const size_t inner = open + 2 + (minus || plus ? 1 : 0);
      const size_t close = find_close(inner, kind == '{' ? '}' : kind, open);
      size_t inner_end = close;
      bool close_minus = false, close_plus = false;
      if (inner_end > inner && src_[inner_end - 1] == '-')
        close_minus = true, --inner_end;
      else if (inner_end > inner && src_[inner_end - 1] == '+')
        close_plus = true, --inner_end;
      const std::string body = src_.substr(inner, inner_end - inner);
      if (kind == '{') out.push_back({Segment::kVar, body, where_at(src_, inner)});
      if (kind == '%') out.push_back({Segment::kBlock, body, where_at(src_, inner)});
      strip_next = close_minus;
      trim_newline = kind != '{' && !close_plus;
      line_starting = false;
      pos = close + 2;
    }
    return out;
  }

 private:
  size_t find_open(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    return src_.size();
  }
  // The position of the closing "}}", "%}" or "#}" (strings skipped).
  size_t find_close(size_t from, char close, size_t open) const {
    char quote = 0;
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      const char ch = src_[i];
      if (close != '#' && quote) {
        if (ch == '\\')
          ++i;
        else if (ch == quote)
          quote = 0;
        continue;
      }
      if (close != '#' && (ch == '\'' || ch == '"')) {
        quote = ch;
        continue;
      }
      if (ch == close && src_[i + 1] == '}') return i;
    }
    throw std::invalid_argument(origin_ + ": chat template tag at " + where_at(src_, open).str() +
                                " is never closed");
  }
  const std::string& src_;
  const std::string& origin_;
};

std::vector<Token> tokenize(const std::string& s, Where base, const std::string& origin) {
  std::vector<Token> out;
  size_t i = 0;
  auto here = [&](size_t at) {
    Where w = base;
    for (size_t k = 0; k < at; ++k) {
      if (s[k] == '\n')
        ++w.line, w.column = 1;
      else
        ++w.column;
    }
    return w;
  };
  while (i < s.size()) {
    const char ch = s[i];
    if (std::isspace(static_cast<unsigned char>(ch))) {
      ++i;
      continue;
    }
    const Where w = here(i);
    if (std::isalpha(static_cast<unsigned char>(ch)) || ch == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::kName, s.substr(i, j - i), w});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(ch))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_' ||
                              (s[j] == '.' && !is_float && j + 1 < s.size() &&
                               std::isdigit(static_cast<unsigned char>(s[j + 1])))))
        is_float |= s[j++] == '.';
      std::string num;
      for (size_t k = i; k < j; ++k)
        if (s[k] != '_') num += s[k];
      out.push_back({is_float ? Token::kFloat : Token::kInt, num, w});
      i = j;
    } else if (ch == '\'' || ch == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != ch; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          v += s[j];
          continue;
        }
        const char e = s[++j];
        v += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == '0' ? '\0' : e;
      }
      if (j >= s.size())
        throw std::invalid_argument(origin + ": unterminated string at " + w.str());
      out.push_back({Token::kString, v, w});
      i = j + 1;
    } else {
      static const char* const kOps[] = {"==", "!=", "<=", ">=", "//", "**", "(", ")", "[",
                                         "]",  "{",  "}",  ",",  ":",  ".",  "|", "+", "-",
                                         "*",  "/",  "%",  "~",  "<",  ">",  "="};
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (s.compare(i, n, op) == 0) {
          out.push_back({Token::kOp, op, w});
          i += n;
          matched = true;
          break;
        }
      }
      if (!matched)
        throw std::invalid_argument(origin + ": unexpected character '" + std::string(1, ch) +
                                    "' at " + w.str());
    }
  }
  out.push_back({Token::kEnd, "", here(s.size())});
  return out;
}

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
      value = std::move(t);
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
      left = std::move(e);
    }
  }
  ExprPtr or_expr() { return binary_chain(&Parser::and_expr, {"or"}, true); }
  ExprPtr and_expr() { return binary_chain(&Parser::not_expr, {"and"}, true); }
  ExprPtr not_expr() {
    if (peek().kind == Token::kName && peek().text == "not") {
      auto e = make(Expr::kUnary, next().where);
      e->text = "not";
      e->a = not_expr();
      return e;
    }
    return compare();
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
      left = std::move(e);
    }
  }
  ExprPtr concat() { return binary_chain(&Parser::add, {"~"}, false); }
  ExprPtr add() { return binary_chain(&Parser::mul, {"+", "-"}, false); }
  ExprPtr mul() { return binary_chain(&Parser::unary, {"*", "/", "//", "%"}, false); }
  ExprPtr unary() {
    if (peek().kind == Token::kOp && (peek().text == "-" || peek().text == "+")) {
      auto e = make(Expr::kUnary, peek().where);
      e->text = next().text;
      e->a = unary();
      return e;
    }
    return postfix(primary());
  }

  ExprPtr postfix(ExprPtr e) {
    if (++depth_ > kMaxNesting) fail(peek().where, "expression nested deeper than 200 levels");
    for (;;) {
      const Token& t = peek();
      if (t.kind == Token::kOp && t.text == ".") {
        auto a = make(Expr::kAttribute, next().where);
        a->text = peek().kind == Token::kInt ? next().text : name();
        a->a = std::move(e);
        e = std::move(a);
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
        auto s = make(slice ? Expr::kSlice : Expr::kSubscript, w);
        s->a = std::move(e);
        s->b = std::move(parts[0]);
        s->c = std::move(parts[1]);
        if (parts[2]) s->args.push_back(std::move(parts[2]));
        e = std::move(s);
      } else if (t.kind == Token::kOp && t.text == "(") {
        auto c = make(Expr::kCall, next().where);
        c->a = std::move(e);
        arguments(*c);
        e = std::move(c);
      } else if (t.kind == Token::kOp && t.text == "|") {
        auto f = make(Expr::kFilter, next().where);
        f->text = name();
        f->a = std::move(e);
        if (accept_op("(")) arguments(*f);
        e = std::move(f);
      } else if (t.kind == Token::kName && t.text == "is") {
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
        e = std::move(f);
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
      if (first && accept_op(")")) return first;
      auto tuple = make(Expr::kTuple, t.where);
      if (first) tuple->args.push_back(std::move(first));
      while (accept_op(",")) {
        if (peek().kind == Token::kOp && peek().text == ")") break;
        tuple->args.push_back(expression());
      }
      if (!tuple->args.empty()) expect_op(")");
      return tuple;
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
      return list;
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
      return dict;
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
  Lexer lexer(source, origin);
  Parser parser(lexer.segments(), origin);
  return parser.parse_all();
}

}  // namespace tightfit::jinja
