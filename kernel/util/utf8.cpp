#include "utf8.hpp"

#include <cstdint>

namespace tightfit {

namespace {

// The well-formed UTF-8 sequence at s[i] (its length), or the length of its
// maximal ill-formed prefix as a negative number (at least 1 byte).
int64_t utf8_sequence_at(const unsigned char* s, size_t n, size_t i) {
  const unsigned char c = s[i];
  if (c < 0x80) return 1;
  // Lead byte: the sequence's length and the range its second byte may take
  // (narrowed to refuse overlong forms, surrogates and past U+10FFFF).
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  if (i + 1 >= n || s[i + 1] < lo || s[i + 1] > hi) return -1;
  for (size_t k = 2; k < len; ++k)
    if (i + k >= n || s[i + k] < 0x80 || s[i + k] > 0xBF) return -static_cast<int64_t>(k);
  return static_cast<int64_t>(len);
}

}  // namespace

size_t first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const int64_t len = utf8_sequence_at(s, text.size(), i);
    if (len < 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int64_t len = utf8_sequence_at(s, bytes.size(), i);
    if (len > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += static_cast<size_t>(-len);
    }
  }
  return out;
}

std::vector<size_t> utf8_code_point_starts(std::string_view text) {
  std::vector<size_t> at;
  for (size_t i = 0; i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) at.push_back(i);
  at.push_back(text.size());
  return at;
}

}  // namespace tightfit
