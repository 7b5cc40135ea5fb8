// What rendering a chat template gives: the text, the spans written inside
// {% generation %}, and where each message's text lies in it.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace tightfit {

// What one message of `messages` became in the text: the [begin, end) bytes
// its iteration of a loop over the messages wrote, at the template's top
// level (not into a macro's or a {% set %} block's captured text).
struct MessageText {
  static constexpr size_t kNone = static_cast<size_t>(-1);
  size_t begin = kNone, end = kNone;  // the first iteration that wrote text for it
  int loops = 0;                      // iterations over it
  int writers = 0;                    // iterations over it that wrote text
};

struct ChatRender {
  std::string text;
  // [begin, end) byte ranges of the text written inside {% generation %}.
  std::vector<std::pair<size_t, size_t>> generation_spans;
  // One per message, in the order of `messages`.
  std::vector<MessageText> messages;
};

}  // namespace tightfit
