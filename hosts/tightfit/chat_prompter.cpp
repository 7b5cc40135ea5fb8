#include "chat_prompter.hpp"

#include <filesystem>
#include <sstream>

#include "file_util.hpp"
#include "generation.hpp"
#include "json_input.hpp"

namespace tightfit::host {
namespace fs = std::filesystem;
namespace {

// A prompts file: a regular file (a FIFO would block), at most 256 MiB.
std::string read_prompts(const std::string& file) {
  try {
    return read_regular_file(file, size_t{256} << 20);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(std::string("prompts: ") + e.what());
  }
}

// What a conversation shows of itself: its last user message.
std::string last_user_message(const nlohmann::ordered_json& messages, const std::string& line) {
  std::string shown = line;
  if (messages.is_array())
    for (const auto& m : messages)
      if (m.is_object() && m.value("role", "") == "user" && m.contains("content") &&
          m["content"].is_string())
        shown = m["content"].get<std::string>();
  return shown;
}

}  // namespace

ChatPrompter::ChatPrompter(Session& session) : tokenizer_(session.data().tokenizer()) {
  const std::string source = tokenizer_.source_file();
  if (!source.empty()) config_ = TokenizerConfig::load(fs::path(source).parent_path().string());
  if (!config_.chat_template.empty())
    template_ = std::make_unique<ChatTemplate>(config_.chat_template, config_.source);
}

std::vector<int64_t> ChatPrompter::eos_ids() const {
  std::vector<int64_t> ids;
  if (const int64_t eos = tokenizer_.token_id(config_.eos_token); eos >= 0) ids.push_back(eos);
  const std::string source = tokenizer_.source_file();
  const fs::path gen = fs::path(source).parent_path() / "generation_config.json";
  nlohmann::json j;
  std::error_code ec;
  if (fs::exists(gen, ec)) j = read_json_file(gen.string(), size_t{16} << 20);
  if (j.is_object() && j.contains("eos_token_id")) {
    const auto& e = j["eos_token_id"];
    for (const auto& v : e.is_array() ? e : nlohmann::json::array({e}))
      if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
  }
  return ids;
}

std::string ChatPrompter::render(const nlohmann::ordered_json& messages) const {
  if (!template_)
    throw std::invalid_argument(
        "the model has no chat template (tokenizer_config.json's chat_template or "
        "chat_template.jinja beside its tokenizer.json): use --prompt");
  return template_->render(messages, true, config_.template_variables()).text;
}

std::string ChatPrompter::render_user(const std::string& message) const {
  return render(nlohmann::ordered_json::array({{{"role", "user"}, {"content", message}}}));
}

std::vector<Prompt> ChatPrompter::prompts_in(const std::string& file) const {
  std::istringstream in(read_prompts(file));
  std::vector<Prompt> out;
  size_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::ordered_json row;
    try {
      row = parse_ordered_json(line, file + ":" + std::to_string(n));
    } catch (const std::invalid_argument&) {
      row = line;  // not JSON: a plain prompt
    }
    if (row.is_object() && row.contains("messages")) {
      out.push_back(
          {render(row["messages"]), last_user_message(row["messages"], line), eos_ids(), true});
    } else if (row.is_object() && row.contains("prompt") && row["prompt"].is_string()) {
      const std::string prompt = row["prompt"].get<std::string>();
      out.push_back(template_ ? Prompt{render_user(prompt), prompt, eos_ids(), true}
                              : Prompt{prompt, prompt, {}, false});
    } else if (row.is_object()) {
      throw std::invalid_argument(file + ":" + std::to_string(n) +
                                  ": a JSON row needs \"messages\" or \"prompt\"");
    } else {
      out.push_back({line, line, {}, false});
    }
  }
  return out;
}

std::string answer_greedily(Session& session, const Prompt& p, int64_t tokens) {
  SamplingOptions o;
  o.n_tokens = tokens;
  o.top_k = 1;
  o.temperature = 0;
  o.stop_ids = p.stop_ids;
  o.add_special_tokens = !p.rendered;  // a template writes its own special tokens
  return session.generate(p.text, o);
}

}  // namespace tightfit::host
