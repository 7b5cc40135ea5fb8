#include "hf_weights.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "file_util.hpp"
#include "safetensors.hpp"

namespace tightfit {
namespace fs = std::filesystem;

void import_hf_weights(ParamStore& store, const std::map<std::string, at::Tensor>& tensors,
                       const std::string& source) {
  at::NoGradGuard no_grad;
  for (Param& p : store.all()) {
    // Adapters are not part of a model folder (they load on their own).
    if (p.flags & TF_PARAM_ADAPTER) continue;
    auto it = tensors.find(p.name);
    if (it == tensors.end()) {
      const auto dot = p.name.find('.');
      if (dot != std::string::npos) it = tensors.find(p.name.substr(dot + 1));
    }
    if (it == tensors.end())
      throw std::runtime_error(source + " has no tensor \"" + p.name + "\" (is it a checkpoint of this model?)");
    at::Tensor t = it->second;
    if ((p.flags & TF_PARAM_HF_TRANSPOSED) && t.dim() == 2) t = t.t();
    if (t.sizes() != at::IntArrayRef(p.shape))
      throw std::runtime_error(source + ": \"" + it->first + "\" has shape " + c10::str(it->second.sizes()) +
                               ", the recipe's model needs " + c10::str(at::IntArrayRef(p.shape)) +
                               ((p.flags & TF_PARAM_HF_TRANSPOSED) ? " (transposed)" : ""));
    p.value.copy_(t);
  }
}

void load_hf_weights(ParamStore& store, const std::string& path) {
  if (fs::is_directory(path)) {
    const fs::path single = fs::path(path) / "model.safetensors";
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(single)) return import_hf_weights(store, read_safetensors(single.string()).tensors, single.string());
    if (!fs::exists(index))
      throw std::runtime_error("weights folder " + path + " holds neither model.safetensors nor model.safetensors.index.json");
    std::ifstream in(index);
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw std::runtime_error(index.string() + " has no weight_map");
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
        throw std::runtime_error(index.string() + ": shard name \"" + shard + "\" must be a file in the folder");
      shards.insert(shard);
    }
    std::map<std::string, at::Tensor> all;
    for (const auto& shard : shards) {
      auto f = read_safetensors((fs::path(path) / shard).string());
      all.merge(f.tensors);
    }
    return import_hf_weights(store, all, index.string());
  }
  if (!fs::exists(path))
    throw std::runtime_error("weights \"" + path + "\" not found (give a .safetensors file or a model folder)");
  import_hf_weights(store, read_safetensors(path).tensors, path);
}

void save_hf_model(const ParamStore& store, const std::string& dir, const std::string& config_json,
                   const std::string& tokenizer_json_path, const std::function<at::Tensor(const Param&)>& dense) {
  fs::create_directories(dir);
  write_safetensors((fs::path(dir) / "model.safetensors").string(), export_hf_weights(store, dense),
                    {{"format", "pt"}});
  if (!config_json.empty()) write_file_synced((fs::path(dir) / "config.json").string(), config_json);
  if (!tokenizer_json_path.empty()) {
    write_file_synced((fs::path(dir) / "tokenizer.json").string(), read_file_text(tokenizer_json_path));
  }
}

std::map<std::string, at::Tensor> export_hf_weights(const ParamStore& store,
                                                   const std::function<at::Tensor(const Param&)>& dense) {
  std::map<std::string, at::Tensor> out;
  for (const Param& p : store.all()) {
    at::Tensor t = (p.format != TF_FORMAT_DENSE && dense) ? dense(p).detach() : p.value.detach();
    if ((p.flags & TF_PARAM_HF_TRANSPOSED) && t.dim() == 2) t = t.t().contiguous();
    out[p.name] = t;
  }
  return out;
}

}  // namespace tightfit
