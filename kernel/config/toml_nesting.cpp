#include "toml_nesting.hpp"

#include <cstddef>
#include <vector>

#include "recipe_error.hpp"

namespace tightfit {
namespace {

// A small TOML lexer that knows only what nesting needs: strings and
// comments (whose dots and brackets do not count), headers, dotted keys,
// arrays and inline tables.
class NestingScan {
 public:
  NestingScan(const std::string& text, const std::string& source) : t_(text), source_(source) {}

  void run() {
    start_line();
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (c == '\n') {
        ++line_;
        col_ = 0;
        ++i_;
        if (frames_.empty()) start_line();
        continue;
      }
      if (c == '#') {
        while (i_ < t_.size() && t_[i_] != '\n') advance();
        continue;
      }
      if (c == '"' || c == '\'') {
        skip_string(c);
        continue;
      }
      if (at_line_start_ && frames_.empty() && c == '[') {
        header();
        continue;
      }
      if (c != ' ' && c != '\t' && c != '\r') at_line_start_ = false;
      if (expect_key_) {
        key_char(c);
      } else {
        value_char(c);
      }
      advance();
    }
  }

 private:
  struct Frame {
    bool inline_table;
    int depth;  // of the values inside
  };

  void start_line() {
    at_line_start_ = true;
    expect_key_ = true;
    key_dots_ = 0;
  }

  void advance() {
    ++i_;
    ++col_;
  }

  void check(int depth) const {
    if (depth <= kMaxTomlNesting) return;
    throw RecipeError(source_ + ":" + std::to_string(line_) + ":" + std::to_string(col_ + 1) +
                      ": tables, arrays or dotted keys nest deeper than " +
                      std::to_string(kMaxTomlNesting) +
                      " levels; a recipe nests a few. Is this the file you meant?");
  }

  // The table a key at this point goes into.
  int table_depth() const { return frames_.empty() ? header_depth_ : frames_.back().depth; }

  // "[a.b.c]" or "[[a.b]]": the keys after it go that deep.
  void header() {
    int depth = 1;
    advance();
    if (i_ < t_.size() && t_[i_] == '[') {
      ++depth;  // an array of tables adds the array
      advance();
    }
    while (i_ < t_.size() && t_[i_] != ']' && t_[i_] != '\n') {
      if (t_[i_] == '"' || t_[i_] == '\'') {
        skip_string(t_[i_]);
        continue;
      }
      if (t_[i_] == '.') check(++depth);
      advance();
    }
    header_depth_ = depth;
    at_line_start_ = false;
    expect_key_ = false;  // only a comment may follow on the line
  }

  void key_char(char c) {
    if (c == '.') {
      check(table_depth() + ++key_dots_ + 1);
    } else if (c == '=') {
      expect_key_ = false;
      value_depth_ = table_depth() + key_dots_ + 1;
    } else if (c == '}' && !frames_.empty() && frames_.back().inline_table) {
      close();  // "{}"
    }
  }

  void value_char(char c) {
    const int depth =
        frames_.empty() || frames_.back().inline_table ? value_depth_ : frames_.back().depth;
    if (c == '[' || c == '{') {
      check(depth + 1);
      frames_.push_back({c == '{', depth + 1});
      if (c == '{') {
        expect_key_ = true;
        key_dots_ = 0;
      }
    } else if (c == ']' || c == '}') {
      close();
    } else if (c == ',' && !frames_.empty() && frames_.back().inline_table) {
      expect_key_ = true;
      key_dots_ = 0;
    }
  }

  void close() {
    if (frames_.empty()) return;  // TOML++ reports the stray bracket
    frames_.pop_back();
    expect_key_ = false;
    if (!frames_.empty() && frames_.back().inline_table) value_depth_ = frames_.back().depth + 1;
  }

  // Basic, literal and multi-line strings; an unclosed one ends the scan.
  void skip_string(char quote) {
    const bool multi = t_.compare(i_, 3, std::string(3, quote)) == 0;
    advance();
    if (multi) {
      advance();
      advance();
    }
    while (i_ < t_.size()) {
      const char c = t_[i_];
      if (quote == '"' && c == '\\') {
        advance();
        if (i_ < t_.size() && t_[i_] == '\n') {
          ++line_;
          col_ = -1;
        }
        advance();
        continue;
      }
      if (c == '\n') {
        if (!multi) return;  // TOML++ reports it
        ++line_;
        col_ = 0;
        ++i_;
        continue;
      }
      if (c == quote && (!multi || t_.compare(i_, 3, std::string(3, quote)) == 0)) {
        for (int k = 0; k < (multi ? 3 : 1); ++k) advance();
        return;
      }
      advance();
    }
  }

  const std::string& t_;
  const std::string& source_;
  size_t i_ = 0;
  int line_ = 1, col_ = 0;
  bool at_line_start_ = true, expect_key_ = true;
  int key_dots_ = 0, header_depth_ = 0, value_depth_ = 1;
  std::vector<Frame> frames_;
};

}  // namespace

void check_toml_nesting(const std::string& text, const std::string& source) {
  NestingScan(text, source).run();
}

}  // namespace tightfit
