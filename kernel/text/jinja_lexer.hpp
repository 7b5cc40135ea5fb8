// Jinja's lexer for chat templates: the template cut into text and tags with
// transformers' whitespace settings (trim_blocks, lstrip_blocks, "-" and "+"
// controls), and a tag's inside cut into tokens (internal to chat_template).
#pragma once

#include <string>
#include <vector>

#include "jinja_ast.hpp"

namespace tightfit::jinja {

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

// The template's text and tags (comments dropped). Throws
// std::invalid_argument naming `origin` for a tag that is never closed.
std::vector<Segment> segments(const std::string& source, const std::string& origin);

// A tag's inside as tokens; `base` is where it starts in the template.
std::vector<Token> tokenize(const std::string& s, Where base, const std::string& origin);

}  // namespace tightfit::jinja
