#include "jinja_lexer.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace tightfit::jinja {
namespace {

// Where each line starts, found once: a place is a binary search, so
// reporting places stays linear in the template's size however many tags it has.
class LineStarts {
 public:
  explicit LineStarts(const std::string& s) {
    starts_.push_back(0);
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] == '\n') starts_.push_back(i + 1);
  }
  Where at(size_t pos) const {
    const auto after = std::upper_bound(starts_.begin(), starts_.end(), pos);
    const auto line = static_cast<size_t>(after - starts_.begin());  // >= 1: starts_[0] = 0
    Where w;
    w.line = static_cast<int>(line);
    w.column = static_cast<int>(pos - starts_[line - 1] + 1);
    return w;
  }

 private:
  std::vector<size_t> starts_;
};

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& origin)
      : src_(src), origin_(origin), lines_(src) {}
  Where where_at(size_t pos) const { return lines_.at(pos); }

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
        if (!text.empty()) out.push_back({Segment::kText, text, where_at(pos)});
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
      if (!text.empty()) out.push_back({Segment::kText, text, where_at(pos)});
      const size_t inner = open + 2 + (minus || plus ? 1 : 0);
      const size_t close = find_close(inner, kind == '{' ? '}' : kind, open);
      size_t inner_end = close;
      bool close_minus = false, close_plus = false;
      if (inner_end > inner && src_[inner_end - 1] == '-')
        close_minus = true, --inner_end;
      else if (inner_end > inner && src_[inner_end - 1] == '+')
        close_plus = true, --inner_end;
      const std::string body = src_.substr(inner, inner_end - inner);
      if (kind == '{') out.push_back({Segment::kVar, body, where_at(inner)});
      if (kind == '%') out.push_back({Segment::kBlock, body, where_at(inner)});
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
    throw std::invalid_argument(origin_ + ": chat template tag at " + where_at(open).str() +
                                " is never closed");
  }
  const std::string& src_;
  const std::string& origin_;
  LineStarts lines_;
};

}  // namespace

std::vector<Segment> segments(const std::string& source, const std::string& origin) {
  return Lexer(source, origin).segments();
}

std::vector<Token> tokenize(const std::string& s, Where base, const std::string& origin) {
  std::vector<Token> out;
  size_t i = 0;
  // Places only move forward: each is found from the last one, linear in all.
  size_t counted = 0;
  Where cursor = base;
  auto here = [&](size_t at) {
    for (; counted < at; ++counted) {
      if (s[counted] == '\n')
        ++cursor.line, cursor.column = 1;
      else
        ++cursor.column;
    }
    return cursor;
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
      // An exponent, as Jinja's float literals have: 1e300, 2.5E-3.
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          while (k < s.size() && (std::isdigit(static_cast<unsigned char>(s[k])) || s[k] == '_'))
            ++k;
          j = k;
          is_float = true;
        }
      }
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
        throw std::invalid_argument(origin + ": chat template " + w.str() +
                                    ": a string that is never closed");
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
        throw std::invalid_argument(origin + ": chat template " + w.str() +
                                    ": unexpected character '" + std::string(1, ch) + "'");
    }
  }
  out.push_back({Token::kEnd, "", here(s.size())});
  return out;
}

}  // namespace tightfit::jinja
