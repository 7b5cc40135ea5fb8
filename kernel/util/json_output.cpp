#include "json_output.hpp"

#include <cstdio>

#include "json_input.hpp"
#include "utf8.hpp"

namespace tightfit {
namespace {

// While dumping and parsing, byte b (0x80..0xFF) outside UTF-8 stands as the
// private-use code point U+10FF00 + b: valid UTF-8 nlohmann accepts. Only a
// text that had such bytes is translated back, so a document without them
// is untouched even where it holds these code points.
constexpr uint32_t kByteMarks = 0x10FF00;

std::string mark_of(unsigned char b) {
  const uint32_t cp = kByteMarks + b;
  return {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
          static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
}

// The byte a mark at text[i] stands for, or -1 when none starts there.
int mark_at(const std::string& text, size_t i) {
  if (i + 4 > text.size() || static_cast<unsigned char>(text[i]) != 0xF4 ||
      static_cast<unsigned char>(text[i + 1]) != 0x8F)
    return -1;
  const uint32_t cp = ((0xF4u & 0x07) << 18) | ((0x8Fu & 0x3F) << 12) |
                      ((static_cast<unsigned char>(text[i + 2]) & 0x3Fu) << 6) |
                      (static_cast<unsigned char>(text[i + 3]) & 0x3Fu);
  return cp >= kByteMarks + 0x80 && cp <= kByteMarks + 0xFF ? static_cast<int>(cp - kByteMarks)
                                                            : -1;
}

// `s` with each byte outside UTF-8 as its mark; whether there was one.
bool mark_bytes(std::string& s) {
  size_t bad = first_invalid_utf8(s);
  if (bad == std::string::npos) return false;
  std::string out(s, 0, bad);
  for (size_t i = bad; i < s.size();) {
    out += mark_of(static_cast<unsigned char>(s[i++]));
    const size_t next = first_invalid_utf8(std::string_view(s).substr(i));
    const size_t end = next == std::string::npos ? s.size() : i + next;
    out.append(s, i, end - i);
    i = end;
  }
  s = std::move(out);
  return true;
}

// Marks come back as the bytes they stand for.
void unmark_bytes(std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const int b = mark_at(s, i);
    if (b >= 0) {
      out += static_cast<char>(b);
      i += 4;
    } else {
      out += s[i++];
    }
  }
  s = std::move(out);
}

template <class Json, class Fix>
Json with_strings(const Json& j, const Fix& fix, bool& changed) {
  if (j.is_string()) {
    std::string s = j.template get<std::string>();
    changed |= fix(s);
    return s;
  }
  if (j.is_array()) {
    Json out = Json::array();
    for (const auto& e : j) out.push_back(with_strings(e, fix, changed));
    return out;
  }
  if (j.is_object()) {
    Json out = Json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::string key = it.key();
      changed |= fix(key);
      out[key] = with_strings(it.value(), fix, changed);
    }
    return out;
  }
  return j;
}

// Whether any string or key holds a byte outside UTF-8: a read-only walk,
// so the common case (a metrics line every step) copies nothing.
template <class Json>
bool has_stray_bytes(const Json& j) {
  if (j.is_string())
    return first_invalid_utf8(j.template get_ref<const std::string&>()) != std::string::npos;
  if (j.is_array())
    for (const auto& e : j)
      if (has_stray_bytes(e)) return true;
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      if (first_invalid_utf8(it.key()) != std::string::npos || has_stray_bytes(it.value()))
        return true;
  return false;
}

template <class Json>
std::string dump_any(const Json& j, int indent) {
  if (!has_stray_bytes(j)) return j.dump(indent);
  bool marked = false;
  const Json copy = with_strings(j, mark_bytes, marked);
  const std::string text = copy.dump(indent);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const int b = mark_at(text, i);
    if (b < 0) {
      out += text[i++];
      continue;
    }
    char esc[16];  // "\\udcXX": b is a byte, 0x80..0xFF
    std::snprintf(esc, sizeof esc, "\\udc%02x", b);
    out += esc;
    i += 4;
  }
  return out;
}

bool hex4(const std::string& t, size_t at, unsigned& v) {
  if (at + 4 > t.size()) return false;
  v = 0;
  for (size_t k = at; k < at + 4; ++k) {
    const char c = t[k];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return false;
    v = v * 16 + static_cast<unsigned>(d);
  }
  return true;
}

}  // namespace

std::string dump_json(const nlohmann::json& j, int indent) {
  return dump_any(j, indent);
}

std::string dump_json(const nlohmann::ordered_json& j, int indent) {
  return dump_any(j, indent);
}

nlohmann::json parse_own_json(const std::string& text, const std::string& source) {
  // A lone \udcXX (no high surrogate before it) becomes the escaped pair of
  // its mark, \udbff\udfXX, which nlohmann reads; strings are walked after.
  std::string t;
  bool in_string = false, after_high = false, marked = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (!in_string) {
      in_string = c == '"';
      t += c;
      continue;
    }
    if (c == '"') {
      in_string = false;
      after_high = false;
      t += c;
      continue;
    }
    if (c != '\\' || i + 1 >= text.size()) {
      after_high = false;
      t += c;
      continue;
    }
    unsigned v = 0;
    if (text[i + 1] == 'u' && hex4(text, i + 2, v)) {
      if (v >= 0xDC80 && v <= 0xDCFF && !after_high) {
        char pair[16];
        std::snprintf(pair, sizeof pair, "\\udbff\\udf%02x", v - 0xDC00);
        t += pair;
        marked = true;
      } else {
        t.append(text, i, 6);
      }
      after_high = v >= 0xD800 && v <= 0xDBFF;
      i += 5;
      continue;
    }
    t.append(text, i, 2);  // \" \\ \n ...
    after_high = false;
    ++i;
  }
  nlohmann::json j = parse_json(t, source);
  if (!marked) return j;
  bool changed = false;
  return with_strings(
      j,
      [](std::string& s) {
        unmark_bytes(s);
        return true;
      },
      changed);
}

}  // namespace tightfit
