// Well-formed UTF-8, checked and repaired as the Python and Rust libraries
// do, for text from outside (corpora, tokenizer files, JSON written out).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tightfit {

// Offset of the first byte that is not part of well-formed UTF-8 (overlong
// forms, surrogates and code points past U+10FFFF included), or npos.
size_t first_invalid_utf8(std::string_view text);

// `bytes` as UTF-8 text the way Rust's String::from_utf8_lossy makes it (as
// the tokenizers library decodes byte-level tokens): each maximal ill-formed
// subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// The byte offset where each code point of UTF-8 `text` begins, and
// text.size() last (Python indexes str by these).
std::vector<size_t> utf8_code_point_starts(std::string_view text);

}  // namespace tightfit
