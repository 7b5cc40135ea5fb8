#include "tokenizer.hpp"

namespace tightfit {

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::vector<int64_t> ByteTokenizer::encode_with_offsets(
    const std::string& text, std::vector<std::pair<size_t, size_t>>& offsets) const {
  offsets.resize(text.size());
  for (size_t i = 0; i < text.size(); ++i) offsets[i] = {i, i + 1};
  return encode(text);
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  s.reserve(ids.size());
  for (int64_t id : ids) s.push_back(static_cast<char>(id & 0xff));
  return s;
}

}  // namespace tightfit
