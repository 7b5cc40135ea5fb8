#include "chat_data.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "file_util.hpp"
#include "json_input.hpp"

namespace tightfit {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr size_t kMaxDataFileBytes = size_t{16} << 30;

}  // namespace

namespace {

// 1 for each token whose `offsets` hold a byte of one of `spans`.
std::vector<uint8_t> offsets_mask(const std::vector<std::pair<size_t, size_t>>& offsets,
                                  const std::vector<std::pair<size_t, size_t>>& spans) {
  // The first token whose bytes hold `at`, as transformers' char_to_token.
  auto token_at = [&](size_t at) -> std::optional<size_t> {
    for (size_t k = 0; k < offsets.size(); ++k)
      if (offsets[k].first <= at && at < offsets[k].second) return k;
    return std::nullopt;
  };
  std::vector<uint8_t> mask(offsets.size(), 0);
  for (const auto& [begin, end] : spans) {
    if (end <= begin) continue;
    const auto first = token_at(begin);
    if (!first) break;  // as transformers does
    const auto last = token_at(end - 1);
    const size_t stop = last && *last > 0 ? *last + 1 : offsets.size();
    for (size_t k = *first; k < stop; ++k) mask[k] = 1;
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
  try {
    return chat_template(where).render(messages, add_generation_prompt, vars);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(where + ": " + e.what());
  }
}

namespace {

// Checks a list of messages: objects with a string role and string (or null) content.
void check_messages(const ojson& messages, const std::string& where, const char* field) {
  if (!messages.is_array() || messages.empty())
    throw std::invalid_argument(where + ": \"" + field + "\" must be a non-empty list of messages");
  for (size_t k = 0; k < messages.size(); ++k) {
    const ojson& m = messages[k];
    const std::string at = where + ": \"" + field + "\"[" + std::to_string(k) + "]";
    if (!m.is_object()) throw std::invalid_argument(at + " must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      throw std::invalid_argument(at + ".role must be a string");
    if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null())
      throw std::invalid_argument(at + ".content must be a string");
  }
}

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
  const std::vector<int64_t> prompt_ids = tokenizer_.encode_with_special_tokens(prompt);
  std::vector<int64_t> ids = tokenizer_.encode_with_special_tokens(prompt + completion);
  return prompt_masked(prompt_ids, std::move(ids), train_on_);
}

Example ChatFormatter::chat_prompt_completion(const ojson& prompt, const ojson& completion,
                                              const ojson& tools, const std::string& where) const {
  check_messages(prompt, where, "prompt");
  check_messages(completion, where, "completion");
  ojson all = prompt;
  for (const auto& m : completion) all.push_back(m);
  const std::vector<int64_t> prompt_ids =
      tokenizer_.encode(render(prompt, true, tools, where).text);
  std::vector<int64_t> ids = tokenizer_.encode(render(all, false, tools, where).text);
  return prompt_masked(prompt_ids, std::move(ids), train_on_);
}

Example ChatFormatter::conversation(const ojson& row, const std::string& where) const {
  const ojson& messages = row["messages"];
  check_messages(messages, where, "messages");
  const ojson tools = row.contains("tools") ? row["tools"] : ojson();
  const ChatRender full = render(messages, false, tools, where);
  Example e;
  std::vector<std::pair<size_t, size_t>> offsets;  // encoded once: ids and where each came from
  e.ids = train_on_ == TrainOn::kAll ? tokenizer_.encode(full.text)
                                     : tokenizer_.encode_with_offsets(full.text, offsets);
  if (train_on_ == TrainOn::kAll) {
    e.trained.assign(e.ids.size(), 1);
    return e;
  }
  std::vector<std::pair<size_t, size_t>> spans = full.generation_spans;
  if (!chat_template(where).has_generation_blocks()) {
    // Each assistant turn: what rendering it adds after the prompt for it.
    for (size_t k = 0; k < messages.size(); ++k) {
      if (messages[k]["role"] != "assistant") continue;
      ojson before = ojson::array();
      for (size_t i = 0; i < k; ++i) before.push_back(messages[i]);
      ojson through = before;
      through.push_back(messages[k]);
      const std::string prompt = k == 0 ? std::string() : render(before, true, tools, where).text;
      const std::string turn = render(through, false, tools, where).text;
      if (turn.compare(0, prompt.size(), prompt) != 0 ||
          full.text.compare(0, turn.size(), turn) != 0)
        throw std::invalid_argument(
            where + ": the chat template of " + config_.source + " renders assistant turn " +
            std::to_string(k) +
            " differently once later turns follow (it rewrites earlier turns, as reasoning "
            "templates drop old thoughts), so its tokens cannot be found: add {% generation %} "
            "marks to the template, split the conversation into {\"prompt\", \"completion\"} "
            "rows, or set [data] train_on = \"all\"");
      spans.emplace_back(prompt.size(), turn.size());
    }
  }
  if (spans.empty())
    throw std::invalid_argument(where + ": the conversation has no assistant message to train on");
  e.trained = offsets_mask(offsets, spans);
  return e;
}

Example ChatFormatter::format(const ojson& row, const std::string& where) const {
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
    return masked(tokenizer_.encode_with_special_tokens(text), 0);
  }
  throw std::invalid_argument(where +
                              ": a row needs \"messages\", \"prompt\" and \"completion\", "
                              "\"instruction\" and \"output\", or \"text\"");
}

std::vector<Example> load_examples(const std::string& spec, const ChatFormatter& formatter,
                                   const std::string& base_dir) {
  fs::path p = spec;
  if (p.is_relative() && !base_dir.empty()) p = fs::path(base_dir) / p;
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    for (auto it = fs::recursive_directory_iterator(p, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec) && it->path().extension() == ".jsonl")
        files.push_back(it->path());
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw std::invalid_argument("data folder " + p.string() + " holds no .jsonl file");
  } else {
    files.push_back(p);
  }
  std::vector<Example> out;
  for (const fs::path& file : files) {
    std::string text;
    try {
      text = read_regular_file(file.string(), kMaxDataFileBytes);
    } catch (const std::exception& e) {
      throw std::invalid_argument(std::string("data: ") + e.what());
    }
    size_t line = 0, pos = 0;
    while (pos < text.size()) {
      ++line;
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      const std::string row_text = text.substr(pos, nl - pos);
      pos = nl + 1;
      if (row_text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
      const std::string where = file.string() + ":" + std::to_string(line);
      out.push_back(formatter.format(parse_ordered_json(row_text, where), where));
    }
  }
  if (out.empty()) throw std::invalid_argument("data " + p.string() + " holds no rows");
  return out;
}

}  // namespace tightfit
