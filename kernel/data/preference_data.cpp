#include "preference_data.hpp"

#include <algorithm>
#include <stdexcept>

#include "jsonl_rows.hpp"
#include "utf8.hpp"

namespace tightfit {
using ojson = nlohmann::ordered_json;

namespace {

// The longest common prefix of a and b, in whole code points.
size_t common_prefix(const std::string& a, const std::string& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  while (k > 0 && k < a.size() && (static_cast<unsigned char>(a[k]) & 0xC0) == 0x80) --k;
  return k;
}

// TRL's extract_prompt: the shared start of chosen and rejected. Its loop
// stops at the first difference (one space before it goes to the
// completions) or, where none is found, at the last shared index.
PreferenceSplit extract_prompt(const ojson& chosen, const ojson& rejected,
                               const std::string& where) {
  auto no_prompt = [&] {
    return std::invalid_argument(
        where +
        ": the row has no \"prompt\" and its \"chosen\" and \"rejected\" share no "
        "beginning to take as the prompt: give \"prompt\" explicitly");
  };
  if (chosen.is_string() && rejected.is_string()) {
    const std::string& c = chosen.get_ref<const std::string&>();
    const std::string& r = rejected.get_ref<const std::string&>();
    // Python indexes str by code points (JSON strings are valid UTF-8).
    const std::vector<size_t> cp = utf8_code_point_starts(c), rp = utf8_code_point_starts(r);
    const size_t n = std::min(cp.size(), rp.size()) - 1;
    if (n == 0) throw no_prompt();
    size_t idx = n - 1;  // Python's loop variable after a loop without break
    for (size_t i = 0; i < n; ++i) {
      if (c.compare(cp[i], cp[i + 1] - cp[i], r, rp[i], rp[i + 1] - rp[i]) == 0) continue;
      // At i = 0 TRL's chosen[i - 1] is chosen's last character: a space
      // there would cut the completions to their last characters.
      const size_t before = i == 0 ? cp.size() - 2 : i - 1;
      const bool space = c.compare(cp[before], cp[before + 1] - cp[before], " ") == 0;
      if (space && i == 0) throw no_prompt();
      idx = space ? i - 1 : i;  // an empty prompt is TRL's too
      break;
    }
    return {c.substr(0, cp[idx]), c.substr(cp[idx]), r.substr(rp[idx])};
  }
  if (!chosen.is_array() || !rejected.is_array())
    throw std::invalid_argument(where +
                                ": \"chosen\" and \"rejected\" must both be strings or both be "
                                "lists of messages");
  const size_t n = std::min(chosen.size(), rejected.size());
  if (n == 0) throw no_prompt();
  size_t idx = n - 1;
  for (size_t i = 0; i < n; ++i)
    if (chosen[i] != rejected[i]) {
      idx = i;
      break;
    }
  if (idx == 0) throw no_prompt();
  PreferenceSplit s{ojson::array(), ojson::array(), ojson::array()};
  for (size_t i = 0; i < chosen.size(); ++i) (i < idx ? s.prompt : s.chosen).push_back(chosen[i]);
  for (size_t i = idx; i < rejected.size(); ++i) s.rejected.push_back(rejected[i]);
  return s;
}

const std::string& need_text(const ojson& v, const std::string& where, const char* field) {
  if (!v.is_string()) throw std::invalid_argument(where + ": \"" + field + "\" must be a string");
  return v.get_ref<const std::string&>();
}

}  // namespace

bool conversational(const ojson& v) {
  return v.is_array() && !v.empty() && v[0].is_object() && v[0].contains("role") &&
         v[0].contains("content");
}

bool is_preference_row(const ojson& row) {
  return row.is_object() && row.contains("chosen") && row.contains("rejected");
}

Example preference_sequence(const std::vector<int64_t>& prompt,
                            const std::vector<int64_t>& completion,
                            const PreferenceOptions& options) {
  Example e;
  e.ids = prompt;
  e.ids.insert(e.ids.end(), completion.begin(), completion.end());
  e.trained.assign(prompt.size(), 0);
  e.trained.resize(e.ids.size(), 1);
  const auto n = static_cast<int64_t>(e.ids.size());
  if (options.max_length > 0 && n > options.max_length) {
    const auto cut = static_cast<long>(n - options.max_length);
    if (options.keep_end) {
      e.ids.erase(e.ids.begin(), e.ids.begin() + cut);
      e.trained.erase(e.trained.begin(), e.trained.begin() + cut);
    } else {
      e.ids.resize(static_cast<size_t>(options.max_length));
      e.trained.resize(static_cast<size_t>(options.max_length));
    }
  }
  return e;
}

PreferenceSpecialTokens::PreferenceSpecialTokens(const ChatFormatter& chat) {
  // A special token the config names but the vocabulary lacks would be left
  // out of every row here (transformers would add it with an id past the
  // model's embedding): refused, never dropped.
  auto special = [&](const std::string& token, const char* key) -> int64_t {
    if (token.empty()) return -1;
    const int64_t id = chat.tokenizer().token_id(token);
    if (id < 0)
      throw std::invalid_argument("the tokenizer's config names " + std::string(key) + " \"" +
                                  token +
                                  "\", which is not a token of its vocabulary: preference rows "
                                  "need it; set " +
                                  key + " in tokenizer_config.json to a token the vocabulary has");
    return id;
  };
  eos = special(chat.config().eos_token, "eos_token");
  bos = special(chat.config().bos_token, "bos_token");
}

PreferenceFormatter::PreferenceFormatter(const ChatFormatter& chat, PreferenceOptions options)
    : chat_(chat), options_(options) {
  const PreferenceSpecialTokens special(chat_);
  eos_id_ = special.eos;
  bos_id_ = special.bos;
}

JointSide split_prompt_answer(const Tokenizer& tok, const std::string& prompt,
                              const std::vector<int64_t>& alone, const std::string& answer,
                              const std::string& where, const char* field) {
  const std::vector<int64_t> full = tok.encode(prompt + answer);
  if (alone.size() > full.size())
    throw std::invalid_argument(where + ": \"" + field +
                                "\": the prompt alone makes more tokens than prompt + answer "
                                "(TRL's tokenize_row refuses such a row too): check the row");
  size_t start = alone.size();
  if (!std::equal(alone.begin(), alone.end(), full.begin())) --start;
  return {std::vector<int64_t>(full.begin(), full.begin() + static_cast<long>(start)),
          std::vector<int64_t>(full.begin() + static_cast<long>(start), full.end())};
}

PreferencePair PreferenceFormatter::tokenize_jointly(const std::string& prompt,
                                                     const std::string& chosen,
                                                     const std::string& rejected,
                                                     const std::string& where) const {
  const Tokenizer& tok = chat_.tokenizer();
  // The prompt's own tokens, once for both sides.
  PreferencePair p;
  p.prompt = tok.encode(prompt);
  JointSide c = split_prompt_answer(tok, prompt, p.prompt, chosen, where, "chosen");
  JointSide r = split_prompt_answer(tok, prompt, p.prompt, rejected, where, "rejected");
  // The two prompts may differ only in a last token that merged.
  size_t differ = 0;
  for (size_t i = 0; i < std::min(c.prompt.size(), r.prompt.size()); ++i)
    differ += c.prompt[i] != r.prompt[i];
  const size_t longer = std::max(c.prompt.size(), r.prompt.size());
  if (differ > 1 || longer - std::min(c.prompt.size(), r.prompt.size()) > 1)
    throw std::invalid_argument(where +
                                ": the prompt tokenizes differently before \"chosen\" and "
                                "before \"rejected\" (more than a last merged token; TRL's "
                                "tokenize_row refuses such a row too): check the row");
  p.prompt.resize(std::min(c.prompt.size(), r.prompt.size()));
  // add_bos_token_if_needed, add_eos_token_if_needed.
  for (auto* ids : {&p.prompt, &c.prompt, &r.prompt})
    if (bos_id_ >= 0 && (ids->empty() || ids->front() != bos_id_))
      ids->insert(ids->begin(), bos_id_);
  for (auto* ids : {&c.answer, &r.answer})
    if (ids->empty() || ids->back() != eos_id_) ids->push_back(eos_id_);
  // Too long: the prompts cut to max_prompt_length first, then the answers
  // to max_length - max_prompt_length (TRL's order, with the longer answer's
  // length for both sides).
  const auto longest = static_cast<int64_t>(std::max(c.answer.size(), r.answer.size()));
  const int64_t max_length = options_.max_length, max_prompt = options_.max_prompt_length;
  auto too_long = [&](const JointSide& side) {
    return static_cast<int64_t>(side.prompt.size()) + longest > max_length;
  };
  if ((too_long(c) || too_long(r)) && (max_prompt <= 0 || max_prompt >= max_length))
    throw std::invalid_argument(
        where + ": prompt + answer make " +
        std::to_string(std::max(c.prompt.size(), r.prompt.size()) + static_cast<size_t>(longest)) +
        " tokens, over max_length = " + std::to_string(max_length) +
        ", and max_prompt_length = " + std::to_string(max_prompt) +
        " leaves the answers no room (TRL would cut them to max_length - max_prompt_length): "
        "set [data] max_prompt_length below max_length");
  for (JointSide* side : {&c, &r})
    if (too_long(*side) && static_cast<int64_t>(side->prompt.size()) > max_prompt) {
      const auto cut = static_cast<long>(side->prompt.size() - static_cast<size_t>(max_prompt));
      if (options_.keep_end)
        side->prompt.erase(side->prompt.begin(), side->prompt.begin() + cut);
      else
        side->prompt.resize(static_cast<size_t>(max_prompt));
    }
  for (JointSide* side : {&c, &r})
    if (too_long(*side) && static_cast<int64_t>(side->answer.size()) > max_length - max_prompt)
      side->answer.resize(static_cast<size_t>(max_length - max_prompt));
  p.chosen = std::move(c.answer);
  p.rejected = std::move(r.answer);
  p.chosen_prompt = std::move(c.prompt);
  p.rejected_prompt = std::move(r.prompt);
  return p;
}

PreferenceSplit split_preference_row(const ojson& row, const std::string& where) {
  if (row.contains("prompt") && conversational(row["prompt"]) == conversational(row["chosen"]))
    return {row["prompt"], row["chosen"], row["rejected"]};
  return extract_prompt(row["chosen"], row["rejected"], where);
}

PromptTexts render_preference_texts(
    const ChatFormatter& chat, const ojson& prompt_in,
    const std::vector<std::pair<const ojson*, const char*>>& answers, const std::string& where) {
  PromptTexts out;
  if (!conversational(prompt_in)) {
    out.prompt = need_text(prompt_in, where, "prompt");
    for (const auto& [answer, field] : answers)
      out.completions.push_back(need_text(*answer, where, field));
    return out;
  }
  check_chat_messages(prompt_in, where, "prompt", /*content_required=*/true);
  for (const auto& [answer, field] : answers) check_chat_messages(*answer, where, field, true);
  const ojson none;
  const ojson& last = prompt_in.back();
  const std::string& role = last["role"].get_ref<const std::string&>();
  std::string& prompt = out.prompt;
  if (role == "user")
    prompt = chat.render(prompt_in, true, none, where).text;
  else if (role == "assistant")
    prompt = continue_final_message(chat.render(prompt_in, false, none, where).text,
                                    last["content"].get_ref<const std::string&>(), where);
  else
    throw std::invalid_argument(where + ": the prompt's last message is \"" + role +
                                "\"; it must be \"user\" (then the answer follows) or "
                                "\"assistant\" (continued)");
  // The prompt as the whole conversation begins: their shared characters
  // (each answer cut after the prompt as the earlier ones left it, as TRL).
  for (const auto& entry : answers) {
    ojson all = prompt_in;
    for (const auto& m : *entry.first) all.push_back(m);
    const std::string whole = chat.render(all, false, none, where).text;
    prompt.resize(common_prefix(prompt, whole));
    out.completions.push_back(whole.substr(prompt.size()));
  }
  return out;
}

void check_preference_row_keys(const ojson& row, const std::string& where) {
  for (const char* key : {"tools", "chat_template_kwargs", "images"})
    if (row.contains(key))
      throw std::invalid_argument(where + ": \"" + key +
                                  "\" in a preference row is not supported (TRL's preference "
                                  "trainers do not read it from the row either): leave it out");
}

PreferencePair PreferenceFormatter::format(const ojson& row, const std::string& where) const {
  if (!row.is_object()) throw std::invalid_argument(where + ": a row must be a JSON object");
  if (!is_preference_row(row))
    throw std::invalid_argument(where +
                                ": a preference row needs \"chosen\" and \"rejected\" (and "
                                "\"prompt\", unless it is their shared beginning)");
  check_preference_row_keys(row, where);
  if (eos_id_ < 0)
    throw std::invalid_argument(
        where + ": each completion ends with the tokenizer's EOS, and " +
        (chat_.config().source.empty() ? std::string("the tokenizer") : chat_.config().source) +
        " names none (eos_token): give a tokenizer that has one");
  // maybe_extract_prompt, then maybe_apply_chat_template.
  const PreferenceSplit s = split_preference_row(row, where);
  const PromptTexts texts = render_preference_texts(
      chat_, s.prompt, {{&s.chosen, "chosen"}, {&s.rejected, "rejected"}}, where);
  const std::string& prompt = texts.prompt;
  const std::string& chosen_text = texts.completions[0];
  const std::string& rejected_text = texts.completions[1];
  if (options_.joint) return tokenize_jointly(prompt, chosen_text, rejected_text, where);
  // tokenize_row(add_special_tokens = False).
  const Tokenizer& tok = chat_.tokenizer();
  PreferencePair p;
  p.prompt = tok.encode(prompt);
  p.chosen = tok.encode(chosen_text);
  p.rejected = tok.encode(rejected_text);
  p.chosen.push_back(eos_id_);
  p.rejected.push_back(eos_id_);
  if (options_.max_prompt_length > 0 &&
      static_cast<int64_t>(p.prompt.size()) > options_.max_prompt_length)
    p.prompt.erase(p.prompt.begin(),
                   p.prompt.end() - static_cast<long>(options_.max_prompt_length));
  for (auto* c : {&p.chosen, &p.rejected})
    if (options_.max_completion_length > 0 &&
        static_cast<int64_t>(c->size()) > options_.max_completion_length)
      c->resize(static_cast<size_t>(options_.max_completion_length));
  p.chosen_prompt = p.rejected_prompt = p.prompt;
  return p;
}

std::vector<Example> load_preference_examples(const std::string& spec,
                                              const PreferenceFormatter& formatter,
                                              const std::string& base_dir) {
  std::vector<Example> out;
  for_each_jsonl_row(spec, base_dir, [&](const ojson& row, const std::string& where) {
    try {
      const PreferencePair p = formatter.format(row, where);
      out.push_back(preference_sequence(p.chosen_prompt, p.chosen, formatter.options()));
      out.push_back(preference_sequence(p.rejected_prompt, p.rejected, formatter.options()));
    } catch (const DataOutOfMemory& e) {
      throw DataOutOfMemory(where + ": " + e.what());
    } catch (const std::bad_alloc&) {
      throw DataOutOfMemory(where + ": making the row's pair (" + std::to_string(out.size() / 2) +
                            " pairs so far)");
    }
  });
  return out;
}

}  // namespace tightfit
