// Python's str is a sequence of code points, not bytes: indexing, slicing,
// looping, reversing and list() of a string, and the positions find()
// returns, count code points of the UTF-8 text (internal to chat_template).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tightfit::jinja {

class CodePoints {
 public:
  // One pass over `s`, charged to the render's budget; `s` must outlive it.
  explicit CodePoints(const std::string& s);
  int64_t size() const { return ascii_ ? static_cast<int64_t>(s_.size()) : count_; }
  // The k-th code point, 0 <= k < size().
  std::string_view at(int64_t k) const;
  // How many code points begin before byte `offset`.
  int64_t index_of_byte(size_t offset) const;

 private:
  const std::string& s_;
  bool ascii_ = true;
  int64_t count_ = 0;
  std::vector<uint32_t> starts_;  // where each code point begins; only for non-ASCII text
};

}  // namespace tightfit::jinja
