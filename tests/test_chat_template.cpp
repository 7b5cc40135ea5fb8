// Chat templates render as transformers' apply_chat_template renders them:
// the text, the token ids and the assistant-token mask, for the templates of
// the families tightfit fine-tunes, over conversations that reach their
// branches; a template that raises there raises here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "bpe_tokenizer.hpp"
#include "chat_data.hpp"
#include "chat_template.hpp"
#include "jinja_budget.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

using ojson = nlohmann::ordered_json;

// Writes the peer's tokenizer, templates, cases and expected renderings into `dir`.
bool run_peer(const test::TempDir& dir) {
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                          "/tests/peers/chat_template_parity.py " + dir.str();
  return std::system(cmd.c_str()) == 0;
}

ojson read_json(const std::string& path) {
  std::ifstream in(path);
  return ojson::parse(in);
}

TEST(ChatTemplate, MatchesTransformersOnTheFamiliesTemplates) {
  test::TempDir dir;
  ASSERT_TRUE(run_peer(dir)) << "the Python peer failed";
  const ojson templates = read_json(dir.str() + "/templates.json");
  const ojson cases = read_json(dir.str() + "/cases.json");
  const ojson expected = read_json(dir.str() + "/expected.json");
  auto tok = BpeTokenizer::load(dir.str());
  std::map<std::string, ChatTemplate> parsed;
  for (auto it = templates.begin(); it != templates.end(); ++it)
    parsed.emplace(it.key(), ChatTemplate(it.value().get<std::string>(), it.key()));
  int texts = 0, ids = 0, masks = 0, raised = 0;
  for (const ojson& row : expected) {
    const std::string name = row["template"];
    const ojson& c = cases[row["case"].get<size_t>()];
    ojson vars = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    for (auto it = c.begin(); it != c.end(); ++it)
      if (it.key() != "messages") vars[it.key()] = it.value();
    if (!vars.contains("tools")) vars["tools"] = nullptr;
    const std::string what = name + " case " + std::to_string(row["case"].get<int>()) +
                             (row["add_generation_prompt"].get<bool>() ? " +prompt" : "");
    if (row.contains("error")) {
      EXPECT_THROW(parsed.at(name).render(c["messages"], row["add_generation_prompt"], vars),
                   std::runtime_error)
          << what;
      ++raised;
      continue;
    }
    ChatRender r;
    try {
      r = parsed.at(name).render(c["messages"], row["add_generation_prompt"], vars);
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": " << e.what();
      continue;
    }
    EXPECT_EQ(r.text, row["text"].get<std::string>()) << what;
    texts += r.text == row["text"].get<std::string>();
    const std::vector<int64_t> got = tok->encode(r.text);
    EXPECT_EQ(got, row["ids"].get<std::vector<int64_t>>()) << what;
    ids += got == row["ids"].get<std::vector<int64_t>>();
    if (row.contains("assistant_mask")) {
      const std::vector<uint8_t> mask = span_token_mask(*tok, r.text, got, r.generation_spans);
      std::vector<uint8_t> want;
      for (const auto& v : row["assistant_mask"])
        want.push_back(static_cast<uint8_t>(v.get<int>()));
      EXPECT_EQ(mask, want) << what;
      masks += mask == want;
    }
  }
  RecordProperty("texts_equal", texts);
  RecordProperty("ids_equal", ids);
  RecordProperty("masks_equal", masks);
  RecordProperty("raised_as_transformers", raised);
  std::cout << "chat templates: " << texts << " texts, " << ids << " id lists, " << masks
            << " assistant masks equal to transformers'; " << raised << " raised as it does\n";
  EXPECT_GE(texts, 120);

  // The interpreter's bounds leave every family's template room: a 400-message
  // conversation with tools takes a small fraction of the render's budget.
  ojson chat = ojson::array({{{"role", "system"}, {"content", "You are terse."}}});
  for (int i = 0; i < 200; ++i) {
    chat.push_back({{"role", "user"}, {"content", "Question " + std::to_string(i) + "?"}});
    chat.push_back({{"role", "assistant"}, {"content", std::string(400, 'a')}});
  }
  jinja::Spent most;
  int rendered = 0;
  for (const auto& [name, t] : parsed) {
    try {
      t.render(chat, true, {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"tools", nullptr}});
    } catch (const std::runtime_error& e) {
      continue;  // a template that refuses a system turn raises as transformers does
    }
    ++rendered;
    most.steps = std::max(most.steps, jinja::budget_spent().steps);
    most.bytes = std::max(most.bytes, jinja::budget_spent().bytes);
  }
  std::cout << "a 401-message conversation: at most " << most.steps << " steps and " << most.bytes
            << " bytes of work over " << rendered << " templates\n";
  EXPECT_GE(rendered, 5);
  EXPECT_LT(most.steps, jinja::kMaxSteps / 20);
  EXPECT_LT(most.bytes, jinja::kMaxWorkBytes / 20);
}

// Without {% generation %} marks, a turn's loss mask is what rendering the
// conversation through it adds after the prompt for it. The peer computes
// that by rendering every prefix with transformers; tightfit reads the turns
// between the first and the last off one rendering, and must find the same
// tokens, or refuse where the definition does.
TEST(ChatTemplate, TurnsFromOneRenderingMatchRenderingEveryPrefix) {
  test::TempDir dir;
  ASSERT_TRUE(run_peer(dir)) << "the Python peer failed";
  const ojson turns = read_json(dir.str() + "/turns.json");
  auto tok = BpeTokenizer::load(dir.str());
  int equal = 0, refused = 0;
  for (auto t = turns["templates"].begin(); t != turns["templates"].end(); ++t) {
    TokenizerConfig config;
    config.bos_token = "<s>";
    config.eos_token = "</s>";
    config.chat_template = read_json(dir.str() + "/templates.json")[t.key()];
    config.source = t.key();
    const ChatFormatter formatter(*tok, config, TrainOn::kCompletion);
    for (const ojson& want : t.value()) {
      const ojson& row = turns["cases"][want["case"].get<size_t>()];
      const std::string what = t.key() + " case " + std::to_string(want["case"].get<int>());
      if (want.contains("refused")) {
        EXPECT_THROW(formatter.format(row, what), std::invalid_argument) << what;
        ++refused;
        continue;
      }
      Example e;
      try {
        e = formatter.format(row, what);
      } catch (const std::exception& x) {
        ADD_FAILURE() << x.what();
        continue;
      }
      std::vector<uint8_t> mask;
      for (const auto& v : want["mask"]) mask.push_back(v.get<uint8_t>());
      EXPECT_EQ(e.ids, want["ids"].get<std::vector<int64_t>>()) << what;
      EXPECT_EQ(e.trained, mask) << what;
      equal += e.ids == want["ids"].get<std::vector<int64_t>>() && e.trained == mask;
    }
  }
  std::cout << "multi-turn masks: " << equal << " equal to rendering every prefix, " << refused
            << " refused as it refuses\n";
  EXPECT_GE(equal, 25);
  EXPECT_GE(refused, 10);  // qwen3 and deepseek rewrite earlier turns; mistral raises

  // Linear: a 2,000-turn conversation takes a few renderings, not one per turn.
  TokenizerConfig chatml;
  chatml.chat_template = read_json(dir.str() + "/templates.json")["chatml"];
  chatml.source = "chatml";
  const ChatFormatter formatter(*tok, chatml, TrainOn::kCompletion);
  ojson chat = ojson::array();
  for (int i = 0; i < 2000; ++i) {
    chat.push_back({{"role", "user"}, {"content", "q " + std::to_string(i)}});
    chat.push_back({{"role", "assistant"}, {"content", "a " + std::to_string(i)}});
  }
  const Example e = formatter.format({{"messages", chat}}, "long");
  EXPECT_LE(formatter.renders(), 4);
  // Every answer trained: the tokens of "a N", <|im_end|> and the newline
  // after it (special tokens split the text, so each answer is encoded alone).
  int64_t answers = 0;
  for (int i = 0; i < 2000; ++i)
    answers += static_cast<int64_t>(tok->encode("a " + std::to_string(i)).size()) + 2;
  EXPECT_EQ(std::count(e.trained.begin(), e.trained.end(), 1), answers);
}

TEST(ChatTemplate, NamesWhatItCannotEvaluate) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% filter upper %}x{% endfilter %}", "the statement {% filter %} is not supported"},
      {"{{ messages | unique }}", "the filter 'unique' is not supported"},
      {"{{ messages[0].content.zfill(3) }}", "has no method 'zfill'"},
      {"{% if x %}unclosed", "{% endif %} is missing"},
      {"{{ 'a' + 1 }}", "unsupported operand types for +"},
      {"{{ x", "never closed"},
  };
  for (const auto& [source, message] : cases) {
    try {
      ChatTemplate t(source, "tokenizer_config.json");
      t.render(ojson::array({{{"role", "user"}, {"content", "hi"}}}), false);
      ADD_FAILURE() << "accepted: " << source;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    }
  }
}

TEST(ChatTemplate, HostileTemplatesAreBounded) {
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "{% if true %}";
  EXPECT_THROW(ChatTemplate(deep, "t"), std::invalid_argument);
  std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_THROW(ChatTemplate(parens, "t"), std::invalid_argument);
  ChatTemplate loop(
      "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}", "t");
  EXPECT_THROW(loop.render(ojson::array(), false), std::runtime_error);
  ChatTemplate big("{% for i in range(10000) %}{{ 'x' * 100000 }}{% endfor %}", "t");
  EXPECT_THROW(big.render(ojson::array(), false), std::runtime_error);
}

}  // namespace
}  // namespace tightfit
