// The chat-template interpreter on hostile templates and contexts: the
// input's first line is the render's context as JSON ({"messages": [...],
// "add_generation_prompt": bool, and any variables}), the rest the template.
// A bad template must be refused with std::invalid_argument when it parses,
// or std::runtime_error when it renders; nothing else may escape, nothing may
// crash, and every render ends within the interpreter's budget (fuzz/run
// gives each input a time limit, so a hang is a finding).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "chat_template.hpp"
#include "expand_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string all = expand_input(data, size);
  const size_t nl = all.find('\n');
  const std::string context = nl == std::string::npos ? std::string() : all.substr(0, nl);
  const std::string source = nl == std::string::npos ? all : all.substr(nl + 1);
  using ojson = nlohmann::ordered_json;
  ojson ctx = ojson::parse(context, nullptr, /*allow_exceptions=*/false);
  if (!ctx.is_object()) ctx = ojson::object();
  ojson messages = ctx.contains("messages") ? ctx["messages"] : ojson::array();
  const bool prompt = ctx.contains("add_generation_prompt") &&
                      ctx["add_generation_prompt"].is_boolean() &&
                      ctx["add_generation_prompt"].get<bool>();
  ctx.erase("messages");
  try {
    const tightfit::ChatTemplate tpl(source, "fuzz/tokenizer_config.json");
    (void)tpl.render(messages, prompt, ctx);
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  return 0;
}
