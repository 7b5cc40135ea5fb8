#include "data.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "file_util.hpp"
#include "json_input.hpp"
#include "memory_accounting.hpp"

namespace tightfit {
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  return read_file_text(p.string());
}

std::string read_jsonl(const fs::path& p) {
  std::istringstream in(read_file_text(p.string()));
  std::string out, line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = p.string() + ":" + std::to_string(lineno);
    nlohmann::json j;
    try {
      j = parse_json(line, where);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      throw std::runtime_error(where +
                               ": each JSONL line must be an object with a string \"text\"");
    out += j["text"].get<std::string>();
    out += "\n\n";
  }
  return out;
}

std::string read_any(const fs::path& p) {
  return p.extension() == ".jsonl" ? read_jsonl(p) : read_file(p);
}

}  // namespace

int64_t corpus_bytes_on_disk(const std::string& spec, const std::string& base_dir) {
  std::error_code ec;
  fs::path p =
      spec.rfind("builtin:", 0) == 0 ? fs::path("/usr/share/games/fortunes") : fs::path(spec);
  if (p.is_relative() && !base_dir.empty() && !fs::exists(p, ec)) p = fs::path(base_dir) / p;
  if (fs::is_regular_file(p, ec)) return static_cast<int64_t>(fs::file_size(p, ec));
  int64_t total = 0;
  if (fs::is_directory(p, ec))
    for (auto it = fs::recursive_directory_iterator(p, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec)) total += static_cast<int64_t>(it->file_size(ec));
  return total;
}

std::string load_corpus_text(const std::string& spec, const std::string& base_dir) {
  const std::string builtin = "builtin:";
  if (spec.rfind(builtin, 0) == 0) {
    const std::string name = spec.substr(builtin.size());
    if (name != "fortunes")
      throw std::runtime_error("unknown built-in corpus \"" + spec +
                               "\" (available: builtin:fortunes)");
    const fs::path dir = "/usr/share/games/fortunes";
    if (!fs::is_directory(dir))
      throw std::runtime_error("built-in corpus " + spec + " needs Debian's fortunes package in " +
                               dir.string() + "; run scripts/setup (or apt-get install fortunes)");
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto& f : files) {
      // Fortunes are separated by lines holding a single '%'; keep a blank line instead.
      std::istringstream in(read_file(f));
      for (std::string line; std::getline(in, line);) text += (line == "%" ? "" : line) + "\n";
    }
    return text;
  }
  fs::path p = spec;
  if (p.is_relative() && !base_dir.empty() && !fs::exists(p)) p = fs::path(base_dir) / p;
  if (fs::is_regular_file(p)) return read_any(p);
  if (fs::is_directory(p)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(p))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto& f : files) text += read_any(f);
    if (text.empty()) throw std::runtime_error("corpus folder " + p.string() + " holds no text");
    return text;
  }
  std::error_code ec;
  if (fs::exists(p, ec))  // a FIFO, socket or device: never read (a FIFO would wait)
    throw std::runtime_error("corpus \"" + spec +
                             "\" is not a regular file or a folder (give a file, a folder, a "
                             ".jsonl file or builtin:fortunes)");
  throw std::runtime_error(
      "corpus \"" + spec +
      "\" not found (give a file, a folder, a .jsonl file or builtin:fortunes)");
}

double unigram_entropy(const at::Tensor& tokens, int64_t vocab) {
  at::Tensor counts = at::bincount(tokens.flatten(), {}, vocab).to(at::kDouble);
  at::Tensor p = counts / counts.sum();
  p = p.masked_select(p > 0);
  return -(p * p.log()).sum().item<double>();
}

TokenBatcher::TokenBatcher(at::Tensor tokens, int64_t seq_len, int64_t batch_size, uint64_t seed,
                           double val_fraction)
    : seq_len_(seq_len), batch_size_(batch_size), seed_(seed) {
  const int64_t n = tokens.numel();
  int64_t n_val = static_cast<int64_t>(static_cast<double>(n) * val_fraction);
  if (val_fraction > 0 && n_val < seq_len + 2) n_val = 0;
  train_ = tokens.slice(0, 0, n - n_val);
  val_ = n_val ? tokens.slice(0, n - n_val, n) : at::Tensor();
  if (train_.numel() < seq_len + 2)
    throw std::runtime_error(
        "corpus has " + std::to_string(train_.numel()) +
        " training tokens, fewer than data.seq_len + 2 = " + std::to_string(seq_len + 2) +
        "; use a bigger corpus or a shorter seq_len");
}

TokenBatcher::Batch TokenBatcher::sample(const at::Tensor& split, uint64_t stream_seed) const {
  CategoryScope scope(TF_MEM_OTHER);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(stream_seed);
  const int64_t max_start = split.numel() - seq_len_ - 1;
  at::Tensor starts = at::randint(0, max_start + 1, {batch_size_}, gen, at::kLong);
  at::Tensor offsets = at::arange(seq_len_ + 1, at::kLong);
  at::Tensor idx = starts.unsqueeze(1) + offsets.unsqueeze(0);  // [B, T+1]
  at::Tensor window = split.index_select(0, idx.flatten()).view({batch_size_, seq_len_ + 1});
  return {window.slice(1, 0, seq_len_).contiguous(), window.slice(1, 1, seq_len_ + 1).contiguous()};
}

TokenBatcher::Batch TokenBatcher::next() {
  // Each position has its own stream: batches depend only on (seed, position).
  const uint64_t s = seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(position_) + 1;
  ++position_;
  return sample(train_, s);
}

TokenBatcher::Batch TokenBatcher::validation(int64_t i) const {
  const at::Tensor& split = val_.defined() ? val_ : train_;
  return sample(split, (seed_ ^ 0x5bd1e995ull) * 31 + static_cast<uint64_t>(i));
}

}  // namespace tightfit
