// A reward for the right final answer, as GSM8K-style graders judge one:
// the row's reference (its `field`, "answer" by default; text after the
// last "####" when it has one) against the completion's final answer (text
// after its last "####", else the last \boxed{...}, else its last number).
// Numbers compare as numbers (commas, "$" and a trailing "." dropped: "1,000"
// = "1000.0"); anything else as text, spaces trimmed. A row without the
// field stops the run naming it: a reward never guesses.
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>

#include "tightfit/plugin_sdk.hpp"
#include "tightfit/rl/reward_plugin.hpp"

namespace {

struct ExactAnswer {
  tf_sdk::Host host;
  std::string field;
  double score_correct = 1.0, score_wrong = 0.0;
};

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

// The text as a number, once commas, "$" and a trailing "." are dropped.
std::optional<double> as_number(std::string_view text) {
  std::string t;
  for (char c : trim(text))
    if (c != ',' && c != '$') t += c;
  while (!t.empty() && t.back() == '.') t.pop_back();
  if (t.empty() || t.size() > 64) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The last number written in `text` (digits, with commas and one point).
std::optional<std::string> last_number(std::string_view text) {
  std::optional<std::string> last;
  for (size_t i = 0; i < text.size();) {
    const bool digit = text[i] >= '0' && text[i] <= '9';
    if (!digit) {
      ++i;
      continue;
    }
    size_t j = i;
    bool point = false;
    while (j < text.size() &&
           ((text[j] >= '0' && text[j] <= '9') ||
            (text[j] == ',' && j + 1 < text.size() && text[j + 1] >= '0' && text[j + 1] <= '9') ||
            (text[j] == '.' && !point && j + 1 < text.size() && text[j + 1] >= '0' &&
             text[j + 1] <= '9'))) {
      point = point || text[j] == '.';
      ++j;
    }
    const bool negative = i > 0 && text[i - 1] == '-';
    last = (negative ? "-" : "") + std::string(text.substr(i, j - i));
    i = j;
  }
  return last;
}

// The final answer a text gives.
std::string final_answer(std::string_view text, bool reference) {
  if (const auto hashes = text.rfind("####"); hashes != std::string_view::npos)
    return trim(text.substr(hashes + 4));
  if (reference) return trim(text);
  if (const auto boxed = text.rfind("\\boxed{"); boxed != std::string_view::npos) {
    const size_t begin = boxed + 7;
    int depth = 1;
    for (size_t i = begin; i < text.size(); ++i) {
      depth += text[i] == '{' ? 1 : text[i] == '}' ? -1 : 0;
      if (depth == 0) return trim(text.substr(begin, i - begin));
    }
  }
  return last_number(text).value_or(trim(text));
}

bool same(const std::string& got, const std::string& want) {
  const std::optional<double> a = as_number(got), b = as_number(want);
  if (a && b) return std::abs(*a - *b) <= 1e-6 * std::max(1.0, std::abs(*b));
  return got == want;
}

std::vector<double> score(ExactAnswer& s, const tf_rl::RewardBatch& b) {
  std::vector<double> out;
  for (int64_t i = 0; i < b.size(); ++i) {
    const nlohmann::json row = b.row(i);
    if (!row.is_object() || !row.contains(s.field) ||
        !(row[s.field].is_string() || row[s.field].is_number()))
      throw std::invalid_argument("exact_answer: the data row of completion " + std::to_string(i) +
                                  " has no \"" + s.field +
                                  "\" (text or a number): give every prompt row its answer, or "
                                  "set field to the key that holds it");
    const std::string want =
        row[s.field].is_string() ? row[s.field].get<std::string>() : row[s.field].dump();
    out.push_back(same(final_answer(b.completion(i), false), final_answer(want, true))
                      ? s.score_correct
                      : s.score_wrong);
  }
  return out;
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<ExactAnswer>(ExactAnswer{tf_sdk::Host(api, ctx)});
    s->field = s->host.get_string("field");
    s->score_correct = s->host.get_double("score_correct");
    s->score_wrong = s->host.get_double("score_wrong");
    *out = s.release();
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("field", TF_VALUE_STRING, "\"answer\"",
                "the data row's key that holds the reference answer", 1, 0),
    tf_sdk::key("score_correct", TF_VALUE_FLOAT, "1.0", "the reward of a right answer", -1e9, 1e9),
    tf_sdk::key("score_wrong", TF_VALUE_FLOAT, "0.0", "the reward of a wrong or missing one", -1e9,
                1e9),
};

const tf_reward_vtable kVtable = {.struct_size = sizeof(tf_reward_vtable),
                                  .create = create,
                                  .destroy = tf_sdk::destroy_state<ExactAnswer>,
                                  .score = tf_rl::score_hook<ExactAnswer, score>};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_REWARD, "exact_answer", "1.0.0",
    "reward for the right final answer against the row's \"answer\" (numbers as numbers, GSM8K's "
    "#### and \\boxed{} read)",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
