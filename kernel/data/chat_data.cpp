#include "chat_data.hpp"

#include <algorithm>
#include <functional>
#include <queue>
#include <stdexcept>

#include "jsonl_rows.hpp"

namespace tightfit {
using ojson = nlohmann::ordered_json;

namespace {

// For each byte position of `at`, the first token whose bytes [begin, end)
// hold it (transformers' char_to_token), or kNoToken. One sweep over the
// positions in order, the tokens that have begun in a min-heap by index:
// O((tokens + positions) log tokens), however the tokens' bytes overlap.
constexpr size_t kNoToken = static_cast<size_t>(-1);

std::vector<size_t> first_tokens_at(const std::vector<std::pair<size_t, size_t>>& offsets,
                                    const std::vector<size_t>& at) {
  std::vector<size_t> by_begin(offsets.size()), by_position(at.size());
  for (size_t k = 0; k < offsets.size(); ++k) by_begin[k] = k;
  for (size_t k = 0; k < at.size(); ++k) by_position[k] = k;
  std::stable_sort(by_begin.begin(), by_begin.end(),
                   [&](size_t a, size_t b) { return offsets[a].first < offsets[b].first; });
  std::sort(by_position.begin(), by_position.end(),
            [&](size_t a, size_t b) { return at[a] < at[b]; });
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> begun;
  std::vector<size_t> found(at.size(), kNoToken);
  size_t next = 0;
  for (const size_t q : by_position) {
    while (next < by_begin.size() && offsets[by_begin[next]].first <= at[q])
      begun.push(by_begin[next++]);
    // A token that ended before this position ended before every later one.
    while (!begun.empty() && offsets[begun.top()].second <= at[q]) begun.pop();
    if (!begun.empty()) found[q] = begun.top();
  }
  return found;
}

// 1 for each token whose `offsets` hold a byte of one of `spans`, as
// transformers' return_assistant_tokens_mask marks them.
std::vector<uint8_t> offsets_mask(const std::vector<std::pair<size_t, size_t>>& offsets,
                                  const std::vector<std::pair<size_t, size_t>>& spans) {
  std::vector<size_t> at;
  for (const auto& [begin, end] : spans)
    if (end > begin) {
      at.push_back(begin);
      at.push_back(end - 1);
    }
  const std::vector<size_t> token = first_tokens_at(offsets, at);
  std::vector<uint8_t> mask(offsets.size(), 0);
  size_t marked_to_end = offsets.size();  // [marked_to_end, size) is all 1 already
  for (size_t s = 0; s + 1 < token.size(); s += 2) {
    const size_t first = token[s], last = token[s + 1];
    if (first == kNoToken) break;  // as transformers does
    const size_t stop =
        std::min(last != kNoToken && last > 0 ? last + 1 : offsets.size(), marked_to_end);
    for (size_t k = first; k < stop; ++k) mask[k] = 1;
    if (stop == offsets.size() || stop == marked_to_end)
      marked_to_end = std::min(marked_to_end, first);
  }
  return mask;
}

}  // namespace

std::vector<uint8_t> span_token_mask(const Tokenizer& tokenizer, const std::string& text,
                                     const std::vector<int64_t>& ids,
                                     const std::vector<std::pair<size_t, size_t>>& spans) {
  std::vector<std::pair<size_t, size_t>> offsets;
  if (tokenizer.encode_with_offsets(text, offsets) != ids)
    throw std::logic_error("span_token_mask: the ids are not the encoding of the text");
  return offsets_mask(offsets, spans);
}

namespace {

// The tokenizer's work on a row's text, a memory failure named as its stage.
template <class F>
auto tokenizing(const std::string& text, F&& encode) {
  try {
    return encode();
  } catch (const std::bad_alloc&) {
    throw DataOutOfMemory("tokenizing the row's text (" + std::to_string(text.size()) + " bytes)");
  }
}

}  // namespace

void check_chat_messages(const ojson& messages, const std::string& where, const char* field,
                         bool content_required) {
  if (!messages.is_array() || messages.empty())
    throw std::invalid_argument(where + ": \"" + field + "\" must be a non-empty list of messages");
  for (size_t k = 0; k < messages.size(); ++k) {
    const ojson& m = messages[k];
    const std::string at = where + ": \"" + field + "\"[" + std::to_string(k) + "]";
    if (!m.is_object()) throw std::invalid_argument(at + " must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      throw std::invalid_argument(at + ".role must be a string");
    const bool text = m.contains("content") && m["content"].is_string();
    if (content_required ? !text : m.contains("content") && !text && !m["content"].is_null())
      throw std::invalid_argument(at + ".content must be a string");
  }
}

ChatFormatter::ChatFormatter(const Tokenizer& tokenizer, TokenizerConfig config, TrainOn train_on)
    : tokenizer_(tokenizer), config_(std::move(config)), train_on_(train_on) {
  if (!config_.chat_template.empty())
    template_ = std::make_unique<ChatTemplate>(config_.chat_template, config_.source);
}

ChatFormatter::~ChatFormatter() = default;

const ChatTemplate& ChatFormatter::chat_template(const std::string& where) const {
  if (!template_)
    throw std::invalid_argument(
        where + ": a conversation needs the model's chat template, and " +
        (config_.source.empty() ? std::string("the tokenizer") : config_.source) +
        " has none: give [data] chat_template = \"FILE.jinja\", or use {\"prompt\", "
        "\"completion\"} rows");
  return *template_;
}

ChatRender ChatFormatter::render(const ojson& messages, bool add_generation_prompt,
                                 const ojson& tools, const std::string& where) const {
  ojson vars = config_.template_variables();
  vars["tools"] = tools;
  ++renders_;
  try {
    return chat_template(where).render(messages, add_generation_prompt, vars);
  } catch (const std::bad_alloc&) {
    throw DataOutOfMemory("rendering the chat template of " + chat_template(where).origin());
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(where + ": " + e.what());
  }
}

namespace {

const std::string& need_string(const ojson& row, const char* key, const std::string& where) {
  if (!row.contains(key) || !row[key].is_string())
    throw std::invalid_argument(where + ": \"" + key + "\" must be a string");
  return row[key].get_ref<const std::string&>();
}

Example masked(std::vector<int64_t> ids, size_t untrained_prefix) {
  Example e;
  e.trained.assign(ids.size(), 1);
  std::fill_n(e.trained.begin(), std::min(untrained_prefix, ids.size()), uint8_t{0});
  e.ids = std::move(ids);
  return e;
}

// TRL's SFTTrainer: the first len(prompt_ids) tokens are the prompt's, even
// where the prompt's tokens are not a prefix of the whole row's (it warns;
// the data summary counts them).
Example prompt_masked(const std::vector<int64_t>& prompt_ids, std::vector<int64_t> ids,
                      TrainOn train_on) {
  const bool prefix = prompt_ids.size() <= ids.size() &&
                      std::equal(prompt_ids.begin(), prompt_ids.end(), ids.begin());
  Example e = masked(std::move(ids), train_on == TrainOn::kAll ? 0 : prompt_ids.size());
  e.prompt_not_prefix = !prefix;
  return e;
}

}  // namespace

Example ChatFormatter::prompt_completion(const std::string& prompt,
                                         const std::string& completion_in) const {
  // TRL: the completion ends with EOS; the prompt's tokens (with the
  // tokenizer's own BOS) are not trained on.
  std::string completion = completion_in;
  const std::string& eos = config_.eos_token;
  if (!eos.empty() && (completion.size() < eos.size() ||
                       completion.compare(completion.size() - eos.size(), eos.size(), eos) != 0))
    completion += eos;
  const std::vector<int64_t> prompt_ids =
      tokenizing(prompt, [&] { return tokenizer_.encode_with_special_tokens(prompt); });
  const std::string whole = prompt + completion;
  std::vector<int64_t> ids =
      tokenizing(whole, [&] { return tokenizer_.encode_with_special_tokens(whole); });
  return prompt_masked(prompt_ids, std::move(ids), train_on_);
}

Example ChatFormatter::chat_prompt_completion(const ojson& prompt, const ojson& completion,
                                              const ojson& tools, const std::string& where) const {
  check_chat_messages(prompt, where, "prompt");
  check_chat_messages(completion, where, "completion");
  ojson all = prompt;
  for (const auto& m : completion) all.push_back(m);
  const std::string prompt_text = render(prompt, true, tools, where).text;
  const std::vector<int64_t> prompt_ids =
      tokenizing(prompt_text, [&] { return tokenizer_.encode(prompt_text); });
  const std::string text = render(all, false, tools, where).text;
  std::vector<int64_t> ids = tokenizing(text, [&] { return tokenizer_.encode(text); });
  return prompt_masked(prompt_ids, std::move(ids), train_on_);
}

// The bytes of each assistant turn: what rendering it adds after the prompt
// for it (the conversation before it, rendered with the generation prompt).
// The first and the last turn are found by rendering those prefixes, as that
// definition says; a turn between them is read off the one rendering of the
// whole conversation: the text its iteration of the template's loop over the
// messages wrote, after the generation prompt the last turn showed. So the
// work is a few renderings, linear in the conversation, however many turns
// it has (rendering every prefix was quadratic).
std::vector<std::pair<size_t, size_t>> ChatFormatter::assistant_spans(
    const ojson& messages, const ojson& tools, const ChatRender& full,
    const std::string& where) const {
  std::vector<size_t> turns;
  for (size_t k = 0; k < messages.size(); ++k)
    if (messages[k]["role"] == "assistant") turns.push_back(k);
  if (turns.empty()) return {};
  auto refuse = [&](const char* verb, size_t k, const std::string& how) {
    throw std::invalid_argument(
        where + ": the chat template of " + config_.source + " " + verb + " assistant turn " +
        std::to_string(k) + " " + how +
        ", so its tokens cannot be found: add {% generation %} marks to the template, split the "
        "conversation into {\"prompt\", \"completion\"} rows, or set [data] train_on = \"all\"");
  };
  auto prefix = [&](size_t n) {
    ojson head = ojson::array();
    for (size_t i = 0; i < n; ++i) head.push_back(messages[i]);
    return head;
  };
  // [prompt, turn) of turn k, from rendering its prefixes.
  auto rendered = [&](size_t k) {
    const std::string prompt = k == 0 ? std::string() : render(prefix(k), true, tools, where).text;
    const std::string turn =
        k + 1 == messages.size() ? full.text : render(prefix(k + 1), false, tools, where).text;
    if (turn.compare(0, prompt.size(), prompt) != 0 || full.text.compare(0, turn.size(), turn) != 0)
      refuse("renders", k,
             "differently once later turns follow (it rewrites earlier turns, as reasoning "
             "templates drop old thoughts)");
    return std::pair<size_t, size_t>(prompt.size(), turn.size());
  };
  const size_t first = turns.front(), last = turns.back();
  std::vector<std::pair<size_t, size_t>> spans{rendered(first)};
  if (turns.size() == 1) return spans;
  const std::pair<size_t, size_t> last_span = rendered(last);
  if (turns.size() > 2) {
    // Where the loop over the messages wrote each turn in the whole text.
    auto written = [&](size_t k) {
      const MessageText& m = full.messages.at(k);
      if (m.writers != 1)
        refuse("writes", k,
               m.writers == 0 ? "outside a loop over the messages"
                              : "in more than one loop over the messages");
      return m;
    };
    const MessageText& at_last = written(last);
    if (last_span.first < at_last.begin)
      refuse("renders the prompt of", last, "shorter than the text before that turn");
    // The generation prompt the last turn's prompt ends with, and what a
    // turn's rendering adds past its own iteration (usually nothing).
    const std::string generation_prompt =
        full.text.substr(at_last.begin, last_span.first - at_last.begin);
    const MessageText& at_first = written(first);
    if (spans[0].second < at_first.end)
      refuse("renders", first, "shorter than its loop over the messages writes it");
    const std::string after = full.text.substr(at_first.end, spans[0].second - at_first.end);
    if (first > 0 && spans[0].first != at_first.begin + generation_prompt.size())
      refuse("writes", first, "after another generation prompt than the last turn's");
    for (size_t t = 1; t + 1 < turns.size(); ++t) {
      const MessageText& m = written(turns[t]);
      if (full.text.compare(m.begin, generation_prompt.size(), generation_prompt) != 0 ||
          full.text.compare(m.end, after.size(), after) != 0 ||
          m.begin + generation_prompt.size() > m.end + after.size())
        refuse("writes", turns[t], "after another generation prompt than the last turn's");
      spans.emplace_back(m.begin + generation_prompt.size(), m.end + after.size());
    }
  }
  spans.push_back(last_span);
  return spans;
}

Example ChatFormatter::conversation(const ojson& row, const std::string& where) const {
  const ojson& messages = row["messages"];
  check_chat_messages(messages, where, "messages");
  const ojson tools = row.contains("tools") ? row["tools"] : ojson();
  const ChatRender full = render(messages, false, tools, where);
  Example e;
  std::vector<std::pair<size_t, size_t>> offsets;  // encoded once: ids and where each came from
  e.ids = tokenizing(full.text, [&] {
    return train_on_ == TrainOn::kAll ? tokenizer_.encode(full.text)
                                      : tokenizer_.encode_with_offsets(full.text, offsets);
  });
  if (train_on_ == TrainOn::kAll) {
    e.trained.assign(e.ids.size(), 1);
    return e;
  }
  const std::vector<std::pair<size_t, size_t>> spans =
      chat_template(where).has_generation_blocks() ? full.generation_spans
                                                   : assistant_spans(messages, tools, full, where);
  if (spans.empty())
    throw std::invalid_argument(where + ": the conversation has no assistant message to train on");
  e.trained = offsets_mask(offsets, spans);
  return e;
}

Example ChatFormatter::format(const ojson& row, const std::string& where) const {
  try {
    return format_row(row, where);
  } catch (const DataOutOfMemory& e) {
    throw DataOutOfMemory(where + ": " + e.what());
  } catch (const std::bad_alloc&) {
    throw DataOutOfMemory(where + ": making the row's example");
  }
}

Example ChatFormatter::format_row(const ojson& row, const std::string& where) const {
  if (!row.is_object()) throw std::invalid_argument(where + ": a row must be a JSON object");
  if (row.contains("messages")) return conversation(row, where);
  if (row.contains("prompt") || row.contains("completion")) {
    if (!row.contains("prompt") || !row.contains("completion"))
      throw std::invalid_argument(where + ": a row with \"prompt\" needs \"completion\" too");
    if (row["prompt"].is_array() || row["completion"].is_array())
      return chat_prompt_completion(row["prompt"], row["completion"],
                                    row.contains("tools") ? row["tools"] : ojson(), where);
    return prompt_completion(need_string(row, "prompt", where),
                             need_string(row, "completion", where));
  }
  if (row.contains("instruction") || row.contains("output")) {  // Alpaca
    std::string user = need_string(row, "instruction", where);
    if (row.contains("input") && !row["input"].is_null()) {
      const std::string& input = need_string(row, "input", where);
      if (!input.empty()) user += "\n\n" + input;
    }
    const std::string& output = need_string(row, "output", where);
    if (template_)
      return chat_prompt_completion(ojson::array({{{"role", "user"}, {"content", user}}}),
                                    ojson::array({{{"role", "assistant"}, {"content", output}}}),
                                    ojson(), where);
    return prompt_completion(user + "\n\n", output);
  }
  if (row.contains("text")) {
    std::string text = need_string(row, "text", where);
    const std::string& eos = config_.eos_token;
    if (!eos.empty() &&
        (text.size() < eos.size() || text.compare(text.size() - eos.size(), eos.size(), eos) != 0))
      text += eos;
    return masked(tokenizing(text, [&] { return tokenizer_.encode_with_special_tokens(text); }), 0);
  }
  throw std::invalid_argument(where +
                              ": a row needs \"messages\", \"prompt\" and \"completion\", "
                              "\"instruction\" and \"output\", or \"text\"");
}

std::vector<Example> load_examples(const std::string& spec, const ChatFormatter& formatter,
                                   const std::string& base_dir) {
  std::vector<Example> out;
  for_each_jsonl_row(spec, base_dir, [&](const ojson& row, const std::string& where) {
    Example e = formatter.format(row, where);
    try {
      out.push_back(std::move(e));
    } catch (const std::bad_alloc&) {
      throw DataOutOfMemory(where + ": keeping the tokenized rows (" + std::to_string(out.size()) +
                            " so far)");
    }
  });
  return out;
}

namespace {

std::string strip(const std::string& s, bool left, bool right) {
  constexpr const char* kSpace = " \t\n\r\f\v";
  size_t b = left ? s.find_first_not_of(kSpace) : 0;
  if (b == std::string::npos) return {};
  size_t e = right ? s.find_last_not_of(kSpace) + 1 : s.size();
  return s.substr(b, e - b);
}

}  // namespace

std::string continue_final_message(const std::string& rendered, const std::string& content,
                                   const std::string& where) {
  const std::string stripped = strip(content, true, true);
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos)
    throw std::invalid_argument(where +
                                ": the prompt ends with an assistant message, to be continued, "
                                "and the chat template does not write its content as it is");
  const std::string lstripped = strip(content, true, false);
  if (rendered.compare(at, lstripped.size(), content) == 0)
    return rendered.substr(0, at + lstripped.size());
  return rendered.substr(0, at + stripped.size());
}

}  // namespace tightfit
