// A session's weights written out: a Hugging Face folder (merged adapters
// optionally), a PEFT adapter folder, and both as GGUF files.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "file_util.hpp"
#include "gguf_export.hpp"
#include "hf_shards.hpp"
#include "hf_weights.hpp"
#include "input_files.hpp"
#include "json_input.hpp"
#include "plugin_hooks.hpp"
#include "progress.hpp"
#include "session.hpp"
#include "strategy_chain.hpp"
#include "tokenizer_folder.hpp"

namespace tightfit {
namespace fs = std::filesystem;

std::string Session::model_config_json() {
  const tf_model_vtable* vt = plugins_.model.plugin->model();
  const char* config = nullptr;
  if (vt->hf_config_json)  // through the guard: a plugin's exception is named, never let through
    check_plugin_status(call_hook(plugins_.model, vt, TF_MODEL_HOOK(hf_config_json), &config),
                        plugins_.model, "hf_config_json");
  return config ? config : "";
}

void Session::each_export_tensor(
    bool merge, const std::function<void(const std::string&, const at::Tensor&)>& sink) {
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  Progress progress("exporting", static_cast<int64_t>(store_.all().size()), "weights");
  int64_t done = 0;
  // One parameter at a time, in stage order: dense from any tier (gathering
  // one split across ranks takes every rank), merged by the strategies that
  // rewrite it (LoRA).
  for (const Param& p : store_.all()) {
    // Adapters are merged or exported alone; copies (a reference model's)
    // are not the model.
    if (p.flags & (TF_PARAM_ADAPTER | TF_PARAM_COPY)) continue;
    if (p.absent)
      throw std::runtime_error(
          "parameter " + p.name +
          " belongs to a block this recipe skips (sparse middle = \"skip\"); it was never "
          "loaded, so there is no whole model to export. Export the adapters alone (--adapter), "
          "or train with middle = \"frozen\"");
    at::Tensor value = executor_.fetch_weight(p.name).detach();
    if (merge)
      StrategyChain(plugins_.strategies)
          .thread_tensor(TF_STRATEGY_HOOK(export_weight), value, p.name.c_str());
    if (env_.is_rank0()) sink(p.name, hf_layout(p, value));
    progress.set(++done);
  }
}

bool Session::exports_on_this_rank() const {
  // Parameters split across ranks are gathered by every rank; rank 0 writes.
  const bool sharded = std::any_of(store_.all().begin(), store_.all().end(),
                                   [](const Param& p) { return p.residency == TF_TIER_SHARDED; });
  return env_.is_rank0() || sharded;
}

std::string Session::export_hf(const std::string& dir, bool merge, int64_t max_shard_bytes) {
  if (!exports_on_this_rank()) return dir;
  refuse_output_over_inputs(dir, /*folder=*/true, "the exported model");
  const std::string config = model_config_json();
  if (config.empty())
    log(TF_LOG_WARN, "model plugin \"" + plugins_.model.plugin->name +
                         "\" gives no config.json; exporting weights only");
  std::optional<HfShardWriter> writer;
  if (env_.is_rank0()) writer.emplace(dir, max_shard_bytes);
  each_export_tensor(merge,
                     [&](const std::string& name, const at::Tensor& t) { writer->add(name, t); });
  if (writer) {
    writer->finish();
    write_hf_side_files(dir, config, data_.tokenizer().source_file());
    // The byte tokenizer has no file of its own: written as one, so that the
    // folder is whole for transformers and for tightfit (tokenizer = "auto").
    if (dynamic_cast<const ByteTokenizer*>(&data_.tokenizer())) {
      write_file_synced((fs::path(dir) / "tokenizer.json").string(), byte_tokenizer_json());
      write_file_synced((fs::path(dir) / "tokenizer_config.json").string(),
                        byte_tokenizer_config_json());
    }
  }
  return dir;
}

std::string Session::export_gguf(const std::string& file, const std::string& type) {
  if (!exports_on_this_rank()) return file;
  refuse_output_over_inputs(file, /*folder=*/false, "the exported model");
  const std::string config = model_config_json();
  if (config.empty())
    throw std::runtime_error("model plugin \"" + plugins_.model.plugin->name +
                             "\" gives no config.json, which a GGUF file's metadata is made from");
  // Checked (architecture, tokenizer, type) before any weight is read.
  std::optional<gguf::GgufModelWriter> writer;
  if (env_.is_rank0())
    writer.emplace(file, parse_json(config, "the model's config.json"), gguf::out_type(type),
                   data_.tokenizer().source_file(), fs::path(file).stem().string());
  each_export_tensor(true, [&](const std::string& name, const at::Tensor& t) {
    writer->add(name, t, [&](const std::string& m) { log(TF_LOG_WARN, m); });
  });
  if (writer) writer->finish();
  return file;
}

namespace {

// The strategies' adapters written into `dir` (a PEFT folder); refused when
// no strategy has any.
void write_adapters(std::vector<PluginInstance>& strategies, const std::string& dir) {
  at::NoGradGuard no_grad;
  bool written = false;
  StrategyChain(strategies)
      .each_with(
          TF_STRATEGY_HOOK(export_adapter),
          [&](size_t i, tf_status st) {
            written = written || st == TF_OK;
            check_plugin_status(st, strategies[i], "export_adapter");
          },
          dir.c_str());
  if (!written)
    throw std::runtime_error(
        "no strategy of this recipe has adapters to export (add a [[strategy]] with plugin = "
        "\"lora\"), or export the whole model without --adapter");
}

}  // namespace

std::string Session::export_adapter(const std::string& dir) {
  refuse_output_over_inputs(dir, /*folder=*/true, "the adapter");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir + ": " + ec.message());
  const HfWeightSource* weights = weight_source();
  if (!weights || !weights->is_gguf()) {
    write_adapters(plugins_.strategies, dir);
    return dir;
  }
  // PEFT loads an adapter's base with AutoModelForCausalLM.from_pretrained(
  // base_model_name_or_path), which reads no GGUF file (that needs its
  // gguf_file argument): the base this adapter applies to, the GGUF file as
  // the run read it (dequantized, as transformers' GGUF loader reads it), is
  // written beside it as a Hugging Face folder, and the adapter names it.
  const std::string base = fs::absolute(fs::path(dir) / "base").lexically_normal().string();
  export_hf(base, /*merge=*/false);
  const std::string source = env_.model_source;
  struct Restore {
    RunEnvironment& env;
    std::string source;
    ~Restore() {
      env.model_source = source;
      env.run_info.model_source = env.model_source.c_str();
    }
  } restore{env_, source};
  env_.model_source = base;
  env_.run_info.model_source = env_.model_source.c_str();
  write_adapters(plugins_.strategies, dir);
  return dir;
}

std::string Session::export_adapter_gguf(const std::string& file, const std::string& type) {
  refuse_output_over_inputs(file, /*folder=*/false, "the adapter");
  const gguf::TensorType& tt = gguf::out_type(type);
  const nlohmann::json config = parse_json(model_config_json(), "the model's config.json");
  gguf::gguf_architecture(config);  // refused before anything is written
  // The PEFT folder first (the strategies write adapters only that way),
  // then converted as convert_lora_to_gguf converts it; the folder is ours
  // and goes.
  const std::string peft = file + ".peft-" + std::to_string(::getpid());
  std::error_code ec;
  if (!fs::create_directory(peft, ec))
    throw std::runtime_error("cannot create " + peft + (ec ? ": " + ec.message() : ": it exists") +
                             " (the adapter is written there before it is converted)");
  try {
    write_adapters(plugins_.strategies, peft);  // the base GGUF file is the base: none written
    gguf::write_lora_adapter(peft, config, file, tt, fs::path(file).stem().string());
  } catch (...) {
    remove_tree(peft);
    throw;
  }
  remove_tree(peft);
  return file;
}

}  // namespace tightfit
