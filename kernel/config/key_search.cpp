#include "key_search.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace tightfit {
namespace {

constexpr size_t kMaxText = 4096;    // one declared string
constexpr uint32_t kMaxValues = 64;  // values of one key: fit tries their product

std::string text(const char* s, const char* what) {
  if (s == nullptr) return {};
  const size_t n = strnlen(s, kMaxText + 1);
  if (n > kMaxText) throw std::runtime_error(std::string(what) + " is longer than 4096 bytes");
  return std::string(s, n);
}

// The fields a plugin's struct holds, in a zeroed struct of this host's size.
template <class T>
T copy_sized(const T* p, size_t least, const char* what) {
  if (p->struct_size < least)
    throw std::runtime_error(std::string(what) + " struct_size " + std::to_string(p->struct_size) +
                             " is too small");
  T copy{};
  std::memcpy(&copy, p, std::min<size_t>(p->struct_size, sizeof copy));
  return copy;
}

std::string json_text(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return {};
  const std::string s = j.at(key).get<std::string>();
  if (s.size() > kMaxText) throw std::invalid_argument(std::string("\"") + key + "\" is too long");
  return s;
}

}  // namespace

std::optional<KeySearch> key_search_from_abi(const tf_key_search* search) {
  if (search == nullptr) return std::nullopt;
  const tf_key_search s =
      copy_sized(search, offsetof(tf_key_search, n_values) + sizeof(uint32_t), "tf_key_search");
  if ((s.n_values == 0 || s.values == nullptr) && !(s.flags & TF_SEARCH_KEY_FOLLOWS))
    throw std::runtime_error("tf_key_search lists no values");
  if (s.n_values > kMaxValues)
    throw std::runtime_error("tf_key_search lists " + std::to_string(s.n_values) +
                             " values; fit tries at most 64 of a key");
  KeySearch out;
  out.flags = s.flags;
  out.with = text(s.with, "tf_key_search.with");
  const char* p = reinterpret_cast<const char*>(s.values);
  for (uint32_t i = 0; p != nullptr && i < s.n_values; ++i) {
    const auto* raw = reinterpret_cast<const tf_search_value*>(p);
    const tf_search_value v =
        copy_sized(raw, offsetof(tf_search_value, flags) + sizeof(uint32_t), "tf_search_value");
    if (v.value == nullptr) throw std::runtime_error("a tf_search_value has no value");
    SearchValue sv;
    sv.value = text(v.value, "tf_search_value.value");
    sv.label = text(v.label, "tf_search_value.label");
    sv.approximation = text(v.approximation, "tf_search_value.approximation");
    sv.claims = text(v.claims, "tf_search_value.claims");
    sv.needs = text(v.needs, "tf_search_value.needs");
    sv.quality_penalty = v.quality_penalty;
    sv.flags = v.flags;
    if (!std::isfinite(sv.quality_penalty))
      throw std::runtime_error("tf_search_value " + sv.value + " has no finite quality_penalty");
    out.values.push_back(std::move(sv));
    p += raw->struct_size;
  }
  return out;
}

std::optional<PluginSearch> plugin_search_from_abi(const tf_plugin_search* search) {
  if (search == nullptr) return std::nullopt;
  const tf_plugin_search s = copy_sized(
      search, offsetof(tf_plugin_search, quality_penalty) + sizeof(double), "tf_plugin_search");
  PluginSearch out;
  out.flags = s.flags;
  out.label = text(s.label, "tf_plugin_search.label");
  out.approximation = text(s.approximation, "tf_plugin_search.approximation");
  out.claims = text(s.claims, "tf_plugin_search.claims");
  out.stands_in_for = text(s.stands_in_for, "tf_plugin_search.stands_in_for");
  out.quality_penalty = s.quality_penalty;
  out.stack_order = s.stack_order;
  if (!std::isfinite(out.quality_penalty))
    throw std::runtime_error("tf_plugin_search has no finite quality_penalty");
  return out;
}

nlohmann::json key_search_json(const KeySearch& s) {
  nlohmann::json values = nlohmann::json::array();
  for (const SearchValue& v : s.values)
    values.push_back({{"value", v.value},
                      {"label", v.label},
                      {"approximation", v.approximation},
                      {"claims", v.claims},
                      {"needs", v.needs},
                      {"quality_penalty", v.quality_penalty},
                      {"flags", v.flags}});
  return {{"flags", s.flags}, {"with", s.with}, {"values", values}};
}

KeySearch key_search_from_json(const nlohmann::json& j) {
  KeySearch s;
  s.flags = j.at("flags").get<uint32_t>();
  s.with = json_text(j, "with");
  const nlohmann::json& values = j.at("values");
  if (!values.is_array() || values.size() > kMaxValues ||
      (values.empty() && !(s.flags & TF_SEARCH_KEY_FOLLOWS)))
    throw std::invalid_argument("a key's search values are not 1 to 64 values");
  for (const nlohmann::json& v : values) {
    SearchValue sv;
    sv.value = json_text(v, "value");
    sv.label = json_text(v, "label");
    sv.approximation = json_text(v, "approximation");
    sv.claims = json_text(v, "claims");
    sv.needs = json_text(v, "needs");
    sv.quality_penalty = v.at("quality_penalty").get<double>();
    sv.flags = v.at("flags").get<uint32_t>();
    s.values.push_back(std::move(sv));
  }
  return s;
}

nlohmann::json plugin_search_json(const PluginSearch& s) {
  return {{"flags", s.flags},
          {"label", s.label},
          {"approximation", s.approximation},
          {"claims", s.claims},
          {"stands_in_for", s.stands_in_for},
          {"quality_penalty", s.quality_penalty},
          {"stack_order", s.stack_order}};
}

PluginSearch plugin_search_from_json(const nlohmann::json& j) {
  PluginSearch s;
  s.flags = j.at("flags").get<uint32_t>();
  s.label = json_text(j, "label");
  s.approximation = json_text(j, "approximation");
  s.claims = json_text(j, "claims");
  s.stands_in_for = json_text(j, "stands_in_for");
  s.quality_penalty = j.at("quality_penalty").get<double>();
  s.stack_order = j.at("stack_order").get<int32_t>();
  return s;
}

std::string search_label(const std::string& label, const std::string& value_text) {
  std::string out = label;
  if (const size_t at = out.find("{}"); at != std::string::npos) out.replace(at, 2, value_text);
  return out;
}

}  // namespace tightfit
