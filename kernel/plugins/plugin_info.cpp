#include "plugin_info.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "key_search_checks.hpp"

namespace tightfit {
namespace {

constexpr size_t kMaxText = 1u << 16;  // one string in it

// JSON has no infinities: an open end of a key's range travels as null.
nlohmann::json bound_json(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}
double bound_from_json(const nlohmann::json& v, double open_end) {
  return v.is_null() ? open_end : v.get<double>();
}

}  // namespace

std::string answer_string(const nlohmann::json& j, const char* key, bool required) {
  if (!j.contains(key)) {
    if (required) throw std::invalid_argument(std::string("no \"") + key + "\"");
    return {};
  }
  const std::string s = j.at(key).get<std::string>();
  if (s.size() > kMaxText) throw std::invalid_argument(std::string("\"") + key + "\" is too long");
  return s;
}

FileIdentity file_identity(const struct stat& st) {
  return {st.st_dev, st.st_ino, st.st_size,
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

std::string plugin_path_trust_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};  // a missing path is reported elsewhere
  const bool folder = S_ISDIR(st.st_mode);
  const char* what = folder ? "folder" : "file";
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return std::string("plugin ") + what + " " + path + " belongs to user " +
           std::to_string(st.st_uid) +
           ", neither you nor root: whoever owns it decides what code tightfit runs. Copy it "
           "into a folder of your own";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("plugin ") + what + " " + path + " is writable by " +
           (st.st_mode & S_IWOTH ? "everyone" : "its group") + " (mode " + mode +
           "): anyone who can write it decides what code tightfit runs. Fix it with: chmod go-w " +
           path;
  }
  return {};
}

nlohmann::json file_identity_json(const FileIdentity& id) {
  return {{"device", static_cast<uint64_t>(id.device)},
          {"inode", static_cast<uint64_t>(id.inode)},
          {"size", static_cast<int64_t>(id.size)},
          {"mtime_ns", id.mtime_ns}};
}

nlohmann::json plugin_info_to_json(const PluginInfo& p) {
  nlohmann::json keys = nlohmann::json::array();
  for (const KeySpec& k : p.keys) {
    nlohmann::json key = {{"name", k.name},
                          {"type", static_cast<int>(k.type)},
                          {"doc", k.doc},
                          {"min", bound_json(k.min_value)},
                          {"max", bound_json(k.max_value)},
                          {"choices", k.choices}};
    if (k.default_value) key["default"] = *k.default_value;
    if (k.search) key["search"] = key_search_json(*k.search);
    keys.push_back(std::move(key));
  }
  return {{"path", p.path},
          {"file", file_identity_json(p.file)},
          {"sha256", p.sha256},
          {"kind", static_cast<int>(p.kind)},
          {"abi_version", p.abi_version},
          {"flags", p.flags},
          {"name", p.name},
          {"version", p.version},
          {"description", p.description},
          {"libtorch_version", p.libtorch_version},
          {"keys", keys},
          {"search", p.search ? plugin_search_json(*p.search) : nlohmann::json(nullptr)},
          {"hf_model_types", p.hf_model_types},
          {"model_features", p.model_features},
          {"hooks", p.hooks}};
}

PluginInfo plugin_info_from_json(const nlohmann::json& j) {
  try {
    PluginInfo p;
    p.path = answer_string(j, "path");
    const nlohmann::json& f = j.at("file");
    p.file = {static_cast<dev_t>(f.at("device").get<uint64_t>()),
              static_cast<ino_t>(f.at("inode").get<uint64_t>()), f.at("size").get<off_t>(),
              f.at("mtime_ns").get<int64_t>()};
    p.sha256 = answer_string(j, "sha256");
    const int kind = j.at("kind").get<int>();
    if (kind != TF_PLUGIN_MODEL && kind != TF_PLUGIN_STRATEGY && kind != TF_PLUGIN_SCHEDULE &&
        kind != TF_PLUGIN_REWARD)
      throw std::invalid_argument("unknown kind " + std::to_string(kind));
    p.kind = static_cast<tf_plugin_kind>(kind);
    p.abi_version = j.at("abi_version").get<uint32_t>();
    p.flags = j.at("flags").get<uint32_t>();
    p.name = answer_string(j, "name");
    if (p.name.empty()) throw std::invalid_argument("no name");
    p.version = answer_string(j, "version");
    p.description = answer_string(j, "description");
    p.libtorch_version = answer_string(j, "libtorch_version");
    for (const nlohmann::json& k : j.at("keys")) {
      KeySpec s;
      s.name = answer_string(k, "name");
      const int type = k.at("type").get<int>();
      if (type < TF_VALUE_BOOL || type > TF_VALUE_PATH)
        throw std::invalid_argument("key \"" + s.name + "\" has an unknown type");
      s.type = static_cast<tf_value_type>(type);
      if (k.contains("default")) s.default_value = answer_string(k, "default");
      s.doc = answer_string(k, "doc");
      s.min_value = bound_from_json(k.at("min"), -std::numeric_limits<double>::infinity());
      s.max_value = bound_from_json(k.at("max"), std::numeric_limits<double>::infinity());
      s.choices = answer_string(k, "choices");
      if (k.contains("search")) s.search = key_search_from_json(k.at("search"));
      p.keys.push_back(std::move(s));
    }
    check_key_searches(p.keys, p.name);
    if (!j.at("search").is_null()) p.search = plugin_search_from_json(j.at("search"));
    for (const nlohmann::json& t : j.at("hf_model_types"))
      p.hf_model_types.push_back(t.get<std::string>());
    p.model_features = j.at("model_features").get<uint64_t>();
    for (const nlohmann::json& h : j.at("hooks")) p.hooks.push_back(h.get<std::string>());
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(e.what());
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
}

}  // namespace tightfit
