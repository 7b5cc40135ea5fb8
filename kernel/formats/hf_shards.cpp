#include "hf_shards.hpp"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "file_util.hpp"
#include "safetensors.hpp"

namespace tightfit {
namespace fs = std::filesystem;

namespace {
std::string temp_name(size_t i) {
  return ".tmp-shard-" + std::to_string(i + 1) + ".safetensors";
}
std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}
}  // namespace

HfShardWriter::HfShardWriter(std::string dir, int64_t max_shard_bytes)
    : dir_(std::move(dir)), max_shard_bytes_(max_shard_bytes) {
  if (max_shard_bytes_ <= 0) throw std::invalid_argument("max shard size must be positive");
  fs::create_directories(dir_);
}

HfShardWriter::~HfShardWriter() {
  std::error_code ec;
  for (size_t i = renamed_; i < shards_.size(); ++i) fs::remove(fs::path(dir_) / temp_name(i), ec);
}

void HfShardWriter::add(const std::string& name, const at::Tensor& t) {
  const int64_t bytes = static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
  if (!current_.empty() && current_bytes_ + bytes > max_shard_bytes_) flush();
  current_[name] = t.contiguous().cpu();
  current_bytes_ += bytes;
  total_bytes_ += bytes;
}

void HfShardWriter::flush() {
  if (current_.empty()) return;
  write_safetensors((fs::path(dir_) / temp_name(shards_.size())).string(), current_,
                    {{"format", "pt"}});
  std::vector<std::string> names;
  for (const auto& [n, t] : current_) names.push_back(n);
  shards_.push_back(std::move(names));
  current_.clear();
  current_bytes_ = 0;
}

std::vector<std::string> HfShardWriter::finish() {
  flush();
  const size_t n = shards_.size();
  std::vector<std::string> files;
  // The names of an earlier export into this folder go: a stale index or shard
  // would mix two models.
  for (const char* stale : {"model.safetensors", "model.safetensors.index.json"})
    if (fs::exists(fs::path(dir_) / stale)) fs::remove(fs::path(dir_) / stale);
  if (n == 1) {
    fs::rename(fs::path(dir_) / temp_name(0), fs::path(dir_) / "model.safetensors");
    renamed_ = 1;
    return {(fs::path(dir_) / "model.safetensors").string()};
  }
  nlohmann::json index = {{"metadata", {{"total_size", total_bytes_}}},
                          {"weight_map", nlohmann::json::object()}};
  for (size_t i = 0; i < n; ++i) {
    const std::string name = shard_name(i, n);
    fs::rename(fs::path(dir_) / temp_name(i), fs::path(dir_) / name);
    renamed_ = i + 1;
    for (const auto& t : shards_[i]) index["weight_map"][t] = name;
    files.push_back((fs::path(dir_) / name).string());
  }
  write_file_synced((fs::path(dir_) / "model.safetensors.index.json").string(), index.dump(2));
  return files;
}

}  // namespace tightfit
