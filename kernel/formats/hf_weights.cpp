#include "hf_weights.hpp"

#include <ATen/Parallel.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "file_util.hpp"
#include "gguf_model.hpp"
#include "gguf_quants.hpp"
#include "hf_shards.hpp"
#include "input_files.hpp"
#include "json_input.hpp"
#include "memory_accounting.hpp"
#include "safetensors.hpp"

namespace tightfit {
namespace fs = std::filesystem;

namespace {

// Base weights are checked where they enter: a NaN or infinity in a file
// would otherwise train (every step skipped, or garbage), so it is refused
// naming the tensor, whatever the file's format.
[[noreturn]] void refuse_non_finite(const std::string& source, const std::string& name,
                                    const std::string& where) {
  throw InputError(source + ": tensor \"" + name + "\" holds a NaN or infinity" + where +
                   "; the file is damaged or was saved from a diverged run: use another copy of "
                   "the model");
}

void require_finite(const at::Tensor& t, const std::string& source, const std::string& name) {
  if (!t.is_floating_point() || t.numel() == 0 || t.isfinite().all().item<bool>()) return;
  const int64_t at = at::logical_not(t.isfinite()).flatten().nonzero()[0][0].item<int64_t>();
  refuse_non_finite(source, name, " (first at element " + std::to_string(at) + ")");
}

// A GGUF matrix kept as its blocks: decoded row by row (in parallel, one
// row of scratch a thread) only to look, as the step would decode it.
void require_finite(const gguf::HfBlocks& b, const std::string& source, const std::string& name) {
  if (!b.bytes.defined() || !gguf::can_dequantize(*b.type)) return;
  const auto* bytes = b.bytes.data_ptr<uint8_t>();
  std::atomic<int64_t> first_bad{b.rows};
  at::parallel_for(0, b.rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(b.cols));
    for (int64_t r = begin; r < end && r < first_bad.load(std::memory_order_relaxed); ++r) {
      gguf::dequantize(*b.type, bytes + r * b.row_bytes, b.cols, row.data());
      for (float v : row)
        if (!std::isfinite(v)) {
          for (int64_t seen = first_bad.load();
               r < seen && !first_bad.compare_exchange_weak(seen, r);)
            ;
          return;
        }
    }
  });
  if (first_bad.load() < b.rows)
    refuse_non_finite(source, name, " (in row " + std::to_string(first_bad.load()) + ")");
}

}  // namespace

HfWeightSource::HfWeightSource(const std::string& path) {
  if (gguf::looks_like_gguf(path)) {
    source_ = path;
    gguf_ = std::make_shared<const gguf::GgufReader>(path);
    gguf_config_ = gguf::hf_config(*gguf_);
    return;
  }
  auto open = [&](const std::string& file) {
    readers_.emplace_back(file);
    for (const auto& name : readers_.back().names()) where_[name] = readers_.size() - 1;
  };
  if (fs::is_directory(path)) {
    const fs::path single = fs::path(path) / "model.safetensors";
    const fs::path index = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(single)) {
      source_ = single.string();
      open(source_);
      return;
    }
    if (!fs::exists(index))
      throw std::runtime_error("weights folder " + path +
                               " holds neither model.safetensors nor model.safetensors.index.json");
    source_ = index.string();
    nlohmann::json j;
    try {
      j = read_json_file(index.string(), size_t{256} << 20);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw std::runtime_error(index.string() + " has no weight_map");
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw std::runtime_error(index.string() + ": weight_map values must be file names");
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
        throw std::runtime_error(index.string() + ": shard name \"" + shard +
                                 "\" must be a file in the folder");
      shards.insert(shard);
    }
    for (const auto& shard : shards) open((fs::path(path) / shard).string());
    return;
  }
  if (!fs::exists(path))
    throw std::runtime_error("weights \"" + path +
                             "\" not found (give a .safetensors file or a model folder)");
  source_ = path;
  open(path);
}

void HfWeightSource::load(Param& p) const {
  if (gguf_) {
    at::NoGradGuard no_grad;
    at::Tensor t;
    {
      CategoryScope scope(TF_MEM_TRANSIENT);  // dequantized only until it is in the parameter
      t = gguf::read_hf_tensor(*gguf_, gguf_config_, p.source_name());
      require_finite(t, source_, p.source_name());
    }
    if ((p.flags & TF_PARAM_HF_TRANSPOSED) && t.dim() == 2) t = t.t();
    if (t.sizes() != at::IntArrayRef(p.shape))
      throw std::runtime_error(source_ + ": \"" + p.source_name() + "\" has shape " +
                               c10::str(t.sizes()) + ", the recipe's model needs " +
                               c10::str(at::IntArrayRef(p.shape)) +
                               " (is [model] config the GGUF file too?)");
    p.value.detach().copy_(t);
    return;
  }
  // A copy (a reference model's) reads the tensor of the parameter it copies.
  const std::string& wanted = p.source_name();
  auto it = where_.find(wanted);
  std::string name = wanted;
  if (it == where_.end()) {
    const auto dot = wanted.find('.');
    if (dot != std::string::npos) it = where_.find(name = wanted.substr(dot + 1));
  }
  if (it == where_.end())
    throw std::runtime_error(source_ + " has no tensor \"" + wanted +
                             "\" (is it a checkpoint of this model?)");
  at::NoGradGuard no_grad;
  at::Tensor t;
  {
    CategoryScope scope(
        TF_MEM_TRANSIENT);  // the file's copy lives only until it is in the parameter
    t = readers_[it->second].read(name);
    require_finite(t, source_, name);
  }
  if ((p.flags & TF_PARAM_HF_TRANSPOSED) && t.dim() == 2) t = t.t();
  if (t.sizes() != at::IntArrayRef(p.shape))
    throw std::runtime_error(source_ + ": \"" + name + "\" has shape " + c10::str(t.sizes()) +
                             ", the recipe's model needs " + c10::str(at::IntArrayRef(p.shape)) +
                             ((p.flags & TF_PARAM_HF_TRANSPOSED) ? " (transposed)" : ""));
  p.value.detach().copy_(t);
}

gguf::HfBlocks HfWeightSource::blocks(const Param& p, bool with_bytes) const {
  if (!gguf_)
    throw std::runtime_error("weights " + source_ +
                             " are not a GGUF file, so there are no GGUF blocks to keep");
  if (p.flags & TF_PARAM_HF_TRANSPOSED)
    throw std::runtime_error(p.name + " is stored transposed, so its GGUF rows are not its rows");
  gguf::HfBlocks b = gguf::read_hf_blocks(*gguf_, gguf_config_, p.source_name(), with_bytes);
  require_finite(b, source_, p.source_name());
  if (p.shape != std::vector<int64_t>{b.rows, b.cols})
    throw std::runtime_error(source_ + ": \"" + p.name + "\" has shape [" + std::to_string(b.rows) +
                             ", " + std::to_string(b.cols) + "], the recipe's model needs " +
                             c10::str(at::IntArrayRef(p.shape)));
  return b;
}

void load_hf_weights(ParamStore& store, const std::string& path) {
  const HfWeightSource source(path);
  for (Param& p : store.all())
    // Adapters load on their own; the kernel's copies are taken from the weights.
    if (!(p.flags & TF_PARAM_ADAPTER) && !p.kept_by_host) source.load(p);
}

void save_hf_model(const ParamStore& store, const std::string& dir, const std::string& config_json,
                   const std::string& tokenizer_json_path,
                   const std::function<at::Tensor(const Param&)>& dense) {
  HfShardWriter writer(dir, std::numeric_limits<int64_t>::max());
  for (const auto& [name, t] : export_hf_weights(store, dense)) writer.add(name, t);
  writer.finish();
  write_hf_side_files(dir, config_json, tokenizer_json_path);
}

void write_hf_side_files(const std::string& dir, const std::string& config_json,
                         const std::string& tokenizer_json_path) {
  fs::create_directories(dir);
  if (!config_json.empty())
    write_file_synced((fs::path(dir) / "config.json").string(), config_json);
  if (!tokenizer_json_path.empty()) {
    // The tokenizer's own files as it was read: a tokenizer.json, or the
    // vocab.json + merges.txt or tokenizer.model transformers converts.
    const fs::path source = tokenizer_json_path, from = source.parent_path();
    auto copy = [&](const fs::path& file, const char* name) {
      write_file_synced((fs::path(dir) / name).string(),
                        read_regular_file(file.string(), size_t{512} << 20));
    };
    if (source.filename() == "vocab.json") {
      copy(source, "vocab.json");
      copy(from / "merges.txt", "merges.txt");
    } else if (source.filename() == "tokenizer.model") {
      copy(source, "tokenizer.model");
    } else {
      copy(source, "tokenizer.json");
    }
    // What transformers reads beside it: special tokens, the chat template,
    // generation defaults (copied when the tokenizer's folder has them).
    for (const char* name :
         {"tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
          "chat_template.jinja", "generation_config.json"}) {
      std::error_code ec;
      if (!fs::is_regular_file(from / name, ec)) continue;
      write_file_synced((fs::path(dir) / name).string(),
                        read_regular_file((from / name).string(), size_t{64} << 20));
    }
  }
}

at::Tensor hf_layout(const Param& p, at::Tensor t) {
  return (p.flags & TF_PARAM_HF_TRANSPOSED) && t.dim() == 2 ? t.t().contiguous() : t;
}

std::map<std::string, at::Tensor> export_hf_weights(
    const ParamStore& store, const std::function<at::Tensor(const Param&)>& dense) {
  std::map<std::string, at::Tensor> out;
  for (const Param& p : store.all()) {
    if (p.flags & TF_PARAM_COPY) continue;  // a reference model's, not the model's
    out[p.name] =
        hf_layout(p, (p.format != TF_FORMAT_DENSE && dense) ? dense(p).detach() : p.value.detach());
  }
  return out;
}

}  // namespace tightfit
