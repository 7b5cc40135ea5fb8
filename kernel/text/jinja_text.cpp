#include "jinja_text.hpp"

#include <algorithm>

#include "jinja_budget.hpp"

namespace tightfit::jinja {

namespace {
// A byte that does not continue a UTF-8 sequence begins a code point (text
// that is not UTF-8 counts each stray byte as one, as Python's
// surrogateescape would).
bool begins_code_point(unsigned char c) {
  return (c & 0xC0) != 0x80;
}
}  // namespace

CodePoints::CodePoints(const std::string& s) : s_(s) {
  charge_bytes(s.size());
  ascii_ = std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
  if (ascii_) return;
  starts_.reserve(s.size());
  for (size_t k = 0; k < s.size(); ++k)
    if (begins_code_point(static_cast<unsigned char>(s[k])) || k == 0)
      starts_.push_back(static_cast<uint32_t>(k));
  count_ = static_cast<int64_t>(starts_.size());
}

std::string_view CodePoints::at(int64_t k) const {
  if (ascii_) return std::string_view(s_).substr(static_cast<size_t>(k), 1);
  const size_t begin = starts_[static_cast<size_t>(k)];
  const size_t end =
      static_cast<size_t>(k) + 1 < starts_.size() ? starts_[static_cast<size_t>(k) + 1] : s_.size();
  return std::string_view(s_).substr(begin, end - begin);
}

int64_t CodePoints::index_of_byte(size_t offset) const {
  if (ascii_) return static_cast<int64_t>(offset);
  return std::lower_bound(starts_.begin(), starts_.end(), static_cast<uint32_t>(offset)) -
         starts_.begin();
}

}  // namespace tightfit::jinja
