#include "pcre_regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

namespace tightfit {

Pcre2Regex::Pcre2Regex(const std::string& pattern, const std::string& source, bool literal) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options =
      PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                   options, &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw std::invalid_argument(source + ": regex does not compile at offset " +
                                std::to_string(offset) + ": " + reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
  match_ = pcre2_match_data_create_from_pattern(code, nullptr);
}

Pcre2Regex::~Pcre2Regex() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_));
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

std::vector<std::pair<size_t, size_t>> Pcre2Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  auto* code = static_cast<pcre2_code*>(code_);
  auto* match = static_cast<pcre2_match_data*>(match_);
  size_t pos = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0,
                               match, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // an empty match: step one character
      pos =
          begin +
          (begin < text.size() ? utf8_sequence_length(static_cast<unsigned char>(text[begin])) : 1);
      continue;
    }
    out.emplace_back(begin, end);
    pos = end;
  }
  return out;
}

}  // namespace tightfit
