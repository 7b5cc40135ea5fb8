// A reward plugin built outside tightfit against its installed SDK: the
// share of the row's "keywords" (a list of words in the prompt row) that a
// completion mentions, case-insensitively. A row without keywords gets no
// score from it (NaN, TRL's None): another reward of the recipe judges it.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "tightfit/plugin_sdk.hpp"
#include "tightfit/rl/reward_plugin.hpp"

namespace {

struct Keywords {
  tf_sdk::Host host;
  double bonus_all = 0;  // added when every keyword is there
};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::vector<double> score(Keywords& s, const tf_rl::RewardBatch& b) {
  std::vector<double> out;
  for (int64_t i = 0; i < b.size(); ++i) {
    const nlohmann::json row = b.row(i);
    if (!row.is_object() || !row.contains("keywords") || !row["keywords"].is_array() ||
        row["keywords"].empty()) {
      out.push_back(std::nan(""));
      continue;
    }
    const std::string text = lower(b.completion(i));
    int found = 0, total = 0;
    for (const auto& k : row["keywords"]) {
      if (!k.is_string()) continue;
      ++total;
      found += text.find(lower(k.get<std::string>())) != std::string::npos;
    }
    const double share = total > 0 ? static_cast<double>(found) / total : 0.0;
    out.push_back(share + (total > 0 && found == total ? s.bonus_all : 0.0));
  }
  return out;
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto* s = new Keywords{tf_sdk::Host(api, ctx)};
    s->bonus_all = s->host.get_double("bonus_all");
    *out = s;
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("bonus_all", TF_VALUE_FLOAT, "0.0",
                "added to the share when the completion mentions every keyword", 0, 100),
};

const tf_reward_vtable kVtable = {.struct_size = sizeof(tf_reward_vtable),
                                  .create = create,
                                  .destroy = tf_sdk::destroy_state<Keywords>,
                                  .score = tf_rl::score_hook<Keywords, score>};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_REWARD, "keywords", "1.0.0",
    "the share of the prompt row's \"keywords\" a completion mentions", kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
