// A reward for a completion's length: -|length - target|, in characters
// (Unicode code points, as Python's len of the text) or tokens — TRL's
// documentation example reward_len, with its target a key. Every row gets a
// score.
#include <cmath>
#include <memory>

#include "tightfit/plugin_sdk.hpp"
#include "tightfit/rl/reward_plugin.hpp"

namespace {

struct Length {
  tf_sdk::Host host;
  int64_t target = 50;
  bool tokens = false;
};

// Code points: every byte that does not continue a UTF-8 sequence.
int64_t code_points(std::string_view text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

std::vector<double> score(Length& s, const tf_rl::RewardBatch& b) {
  std::vector<double> out;
  const at::Tensor lengths = b.lengths().to(at::kCPU);
  for (int64_t i = 0; i < b.size(); ++i) {
    const int64_t n = s.tokens ? lengths[i].item<int64_t>() : code_points(b.completion(i));
    out.push_back(-std::abs(static_cast<double>(n - s.target)));
  }
  return out;
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Length>(Length{tf_sdk::Host(api, ctx)});
    s->target = s->host.get_int("target");
    s->tokens = s->host.get_string("unit") == "tokens";
    *out = s.release();
    return TF_OK;
  });
}

const tf_config_key kKeys[] = {
    tf_sdk::key("target", TF_VALUE_INT, "50", "the length that scores 0 (the best)", 0, 1e9),
    tf_sdk::key("unit", TF_VALUE_STRING, "\"chars\"",
                "chars (the text's code points, as Python's len) or tokens", 1, 0, "chars|tokens"),
};

const tf_reward_vtable kVtable = {.struct_size = sizeof(tf_reward_vtable),
                                  .create = create,
                                  .destroy = tf_sdk::destroy_state<Length>,
                                  .score = tf_rl::score_hook<Length, score>};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_REWARD, "length", "1.0.0",
    "reward -|length - target| of each completion, in characters or tokens", kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
