// A reward for a completion's form: score_match where the regular
// expression `pattern` matches its text, score_miss where it does not —
// the format rewards of TRL's GRPO examples (re.match(pattern, content),
// with re.DOTALL by default here: a format spans lines). PCRE2, with match,
// depth and heap limits: a pattern that backtracks without end on some
// completion stops the run naming it, never hangs it.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "tightfit/plugin_sdk.hpp"
#include "tightfit/rl/reward_plugin.hpp"

namespace {

struct Format {
  tf_sdk::Host host;
  std::string pattern, mode;
  double score_match = 1.0, score_miss = 0.0;
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* limits = nullptr;
  ~Format() {
    pcre2_match_context_free(limits);
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
};

bool matches(const Format& s, std::string_view text) {
  const int rc = pcre2_match(s.code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             s.mode == "search" ? 0 : PCRE2_ANCHORED, s.match, s.limits);
  if (rc == PCRE2_ERROR_NOMATCH || rc == PCRE2_ERROR_UTF8_ERR1 ||
      (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21))
    return false;  // invalid UTF-8 (a cut multi-byte character) does not match
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof message);
    throw std::runtime_error("format: pattern \"" + s.pattern + "\" gave up on a completion (" +
                             reinterpret_cast<const char*>(message) +
                             "): simplify the pattern (nested repeats backtrack without end)");
  }
  if (s.mode != "fullmatch") return true;
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.match);
  return ov[1] == text.size();
}

std::vector<double> score(Format& s, const tf_rl::RewardBatch& b) {
  std::vector<double> out;
  for (int64_t i = 0; i < b.size(); ++i)
    out.push_back(matches(s, b.completion(i)) ? s.score_match : s.score_miss);
  return out;
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Format>(Format{tf_sdk::Host(api, ctx)});
    s->pattern = s->host.get_string("pattern");
    s->mode = s->host.get_string("mode");
    s->score_match = s->host.get_double("score_match");
    s->score_miss = s->host.get_double("score_miss");
    if (s->pattern.empty())
      throw std::invalid_argument("format: pattern is required (a regular expression)");
    uint32_t options = PCRE2_UTF | PCRE2_UCP;
    if (s->host.get_bool("dotall")) options |= PCRE2_DOTALL;
    int error = 0;
    PCRE2_SIZE offset = 0;
    s->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(s->pattern.data()), s->pattern.size(),
                            options, &error, &offset, nullptr);
    if (s->code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw std::invalid_argument("format: pattern does not compile at offset " +
                                  std::to_string(offset) + ": " +
                                  reinterpret_cast<const char*>(message));
    }
    s->match = pcre2_match_data_create_from_pattern(s->code, nullptr);
    s->limits = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(s->limits, 1000000);
    pcre2_set_depth_limit(s->limits, 10000);
    pcre2_set_heap_limit(s->limits, 64 * 1024);  // KiB
    *out = s.release();
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("pattern", TF_VALUE_STRING, "\"\"",
                "the regular expression (PCRE2, UTF-8) a well-formed completion matches"),
    tf_sdk::key("mode", TF_VALUE_STRING, "\"match\"",
                "match (at the start, Python's re.match), fullmatch (the whole text) or search "
                "(anywhere)",
                1, 0, "match|fullmatch|search"),
    tf_sdk::key("dotall", TF_VALUE_BOOL, "true", "'.' matches newlines too (re.DOTALL)"),
    tf_sdk::key("score_match", TF_VALUE_FLOAT, "1.0", "the reward of a completion that matches",
                -1e9, 1e9),
    tf_sdk::key("score_miss", TF_VALUE_FLOAT, "0.0", "the reward of one that does not", -1e9, 1e9),
};

const tf_reward_vtable kVtable = {.struct_size = sizeof(tf_reward_vtable),
                                  .create = create,
                                  .destroy = tf_sdk::destroy_state<Format>,
                                  .score = tf_rl::score_hook<Format, score>};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_REWARD, "format", "1.0.0",
    "reward for completions whose text matches a regular expression (a format: tags, a final "
    "answer line)",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
