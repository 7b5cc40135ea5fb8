// The syntax tree of the Jinja subset chat templates use (internal to
// chat_template: jinja_parser.cpp builds it, jinja_eval.cpp runs it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tightfit::jinja {

// A place in the template, for messages: "line 3, column 14".
struct Where {
  int line = 1, column = 1;
  std::string str() const {
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  }
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum Kind {
    kLiteral,    // text: the value as a string; literal_kind says which type
    kName,       // text
    kList,       // args
    kTuple,      // args
    kDict,       // args: key, value, key, value ...
    kAttribute,  // a.text
    kSubscript,  // a[b]
    kSlice,      // a[b:c:d] (absent parts are null)
    kCall,       // a(args), kwarg_names for keyword arguments (empty for positional)
    kFilter,     // a | text(args)
    kTest,       // a is [not] text(args); negated
    kUnary,      // text: "not" | "-" | "+"; a
    kBinary,     // text: operator; a, b
    kTernary,    // a if b else c
  } kind;
  Where where;
  std::string text;
  enum LiteralKind { kNone, kBool, kInt, kFloat, kString } literal_kind = kNone;
  int64_t int_value = 0;  // kInt and kFloat literals, read once by the parser
  double float_value = 0;
  int height = 1;  // 1 + the tallest child: bounds evaluating and freeing the tree
  bool negated = false;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::string> kwarg_names;  // parallel to args for calls and filters
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum Kind {
    kText,        // text
    kOutput,      // {{ expr }}
    kIf,          // conditions[i] -> bodies[i]; else_body
    kFor,         // targets in expr (if filter): body; else_body
    kSet,         // targets (a name, or ns.attr in attribute) = expr
    kSetBlock,    // {% set name %} body {% endset %}
    kGeneration,  // {% generation %} body {% endgeneration %}: assistant output
    kBreak,
    kContinue,
    kMacro,  // {% macro name(params) %} body
  } kind;
  Where where;
  std::string text;
  std::vector<std::string> targets;
  std::string attribute;
  ExprPtr expr, filter;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // parallel to params (null when none)
};

// Parses `source`; throws std::invalid_argument naming `origin`, the place and
// the construct that is not supported.
Body parse(const std::string& source, const std::string& origin);

}  // namespace tightfit::jinja
