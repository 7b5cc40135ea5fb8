#include "added_token_matcher.hpp"

#include <algorithm>
#include <deque>

namespace tightfit {

int32_t AddedTokenMatcher::child(int32_t s, uint8_t c) const {
  const auto& next = states_[static_cast<size_t>(s)].next;
  const auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t{-1}));
  return it != next.end() && it->first == c ? it->second : -1;
}

AddedTokenMatcher::AddedTokenMatcher(const std::vector<std::string>& tokens) {
  states_.emplace_back();
  for (size_t k = 0; k < tokens.size(); ++k) {
    lengths_.push_back(tokens[k].size());
    int32_t s = 0;
    for (auto it = tokens[k].rbegin(); it != tokens[k].rend(); ++it) {  // backwards
      const auto c = static_cast<uint8_t>(*it);
      int32_t t = child(s, c);
      if (t < 0) {
        t = static_cast<int32_t>(states_.size());
        auto& next = states_[static_cast<size_t>(s)].next;
        next.insert(std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t{-1})),
                    {c, t});
        states_.emplace_back();
      }
      s = t;
    }
    State& end = states_[static_cast<size_t>(s)];
    // Two tokens with one text: the first listed wins, as a vocabulary keeps one id.
    if (end.token < 0) end.token = static_cast<int32_t>(k);
  }
  // Fail links breadth first; `longest` is the state's own token, else the
  // fail state's (a shorter suffix of what was read).
  std::deque<int32_t> queue;
  for (const auto& [c, t] : states_[0].next) queue.push_back(t);
  for (auto& [c, t] : states_[0].next)
    states_[static_cast<size_t>(t)].longest = states_[static_cast<size_t>(t)].token;
  while (!queue.empty()) {
    const int32_t s = queue.front();
    queue.pop_front();
    for (const auto& [c, t] : states_[static_cast<size_t>(s)].next) {
      int32_t f = states_[static_cast<size_t>(s)].fail;
      while (f > 0 && child(f, c) < 0) f = states_[static_cast<size_t>(f)].fail;
      const int32_t g = child(f, c);
      State& st = states_[static_cast<size_t>(t)];
      st.fail = g >= 0 && g != t ? g : 0;
      st.longest = st.token >= 0 ? st.token : states_[static_cast<size_t>(st.fail)].longest;
      queue.push_back(t);
    }
  }
}

std::vector<int32_t> AddedTokenMatcher::longest_from(const std::string& text) const {
  std::vector<int32_t> out(text.size(), -1);
  if (empty()) return out;
  int32_t s = 0;
  for (size_t i = text.size(); i-- > 0;) {  // backwards: a match ending here starts at i
    const auto c = static_cast<uint8_t>(text[i]);
    while (s > 0 && child(s, c) < 0) s = states_[static_cast<size_t>(s)].fail;
    const int32_t t = child(s, c);
    s = t < 0 ? 0 : t;
    out[i] = states_[static_cast<size_t>(s)].longest;
  }
  return out;
}

}  // namespace tightfit
