#include "pcre_regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <new>
#include <stdexcept>

namespace tightfit {
namespace {

constexpr size_t kJitStackBytes = size_t{8} << 20;
constexpr uint32_t kMatchLimit = 10'000'000;  // PCRE2's default, set so it is stated here
constexpr uint32_t kHeapLimitKiB = 64 * 1024;

}  // namespace

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
  source_ = source;
  pattern_ = pattern.size() > 80 ? pattern.substr(0, 80) + "..." : pattern;
  // The JIT's default stack (32 KiB) gives up on long texts that real
  // patterns match (a run of spaces for \s+(?!\S)); 8 MiB does not, and the
  // match limit still ends a pattern that backtracks without end.
  auto* context = pcre2_match_context_create(nullptr);
  auto* stack = pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr);
  context_ = context;
  stack_ = stack;
  if (!context || !stack || !match_) {
    this->~Pcre2Regex();  // frees what was made (each free takes null)
    throw std::bad_alloc();
  }
  pcre2_jit_stack_assign(context, nullptr, stack);
  pcre2_set_match_limit(context, kMatchLimit);
  pcre2_set_depth_limit(context, kMatchLimit);
  pcre2_set_heap_limit(context, kHeapLimitKiB);
}

Pcre2Regex::~Pcre2Regex() {
  pcre2_match_context_free(static_cast<pcre2_match_context*>(context_));
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(stack_));
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
                               match, static_cast<pcre2_match_context*>(context_));
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw std::runtime_error(
          source_ + ": the regex \"" + pattern_ + "\" gave up on a text of " +
          std::to_string(text.size()) + " bytes at byte " + std::to_string(pos) + ": " +
          reinterpret_cast<char*>(msg) +
          " (a pattern that backtracks without end on this text; the tokenizer cannot split "
          "it as the tokenizers library would)");
    }
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
