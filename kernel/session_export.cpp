// A session's weights written out: a Hugging Face folder (merged adapters
// optionally) and a PEFT adapter folder.
#include <algorithm>
#include <filesystem>
#include <optional>

#include "file_util.hpp"
#include "hf_shards.hpp"
#include "hf_weights.hpp"
#include "session.hpp"
#include "strategy_chain.hpp"
#include "tokenizer_folder.hpp"

namespace tightfit {
namespace fs = std::filesystem;

std::string Session::export_hf(const std::string& dir, bool merge, int64_t max_shard_bytes) {
  // Gathering parameters split across ranks takes every rank; rank 0 writes.
  const bool sharded = std::any_of(store_.all().begin(), store_.all().end(),
                                   [](const Param& p) { return p.residency == TF_TIER_SHARDED; });
  if (!env_.is_rank0() && !sharded) return dir;
  const tf_model_vtable* vt = plugins_.model.plugin->model();
  const char* config = nullptr;
  if (vt->hf_config_json)
    check_plugin_status(vt->hf_config_json(plugins_.model.state, plugins_.model.ctx.get(), &config),
                        plugins_.model, "hf_config_json");
  if (!config)
    log(TF_LOG_WARN, "model plugin \"" + plugins_.model.plugin->name +
                         "\" gives no config.json; exporting weights only");
  at::NoGradGuard no_grad;
  CategoryScope scope(TF_MEM_TRANSIENT);
  // One parameter at a time, in stage order: dense from any tier, merged by
  // the strategies that rewrite it (LoRA), into the current shard.
  std::optional<HfShardWriter> writer;
  if (env_.is_rank0()) writer.emplace(dir, max_shard_bytes);
  for (const Param& p : store_.all()) {
    if (p.flags & TF_PARAM_ADAPTER) continue;
    if (p.absent)
      throw std::runtime_error(
          "parameter " + p.name +
          " belongs to a block this recipe skips (sparse middle = \"skip\"); it was never "
          "loaded, so there is no whole model to export. Export the adapters alone (--adapter), "
          "or train with middle = \"frozen\"");
    at::Tensor value = executor_.fetch_weight(p.name).detach();
    if (merge)
      StrategyChain(plugins_.strategies)
          .thread_tensor(&tf_strategy_vtable::export_weight, "export_weight", value,
                         p.name.c_str());
    if (writer) writer->add(p.name, hf_layout(p, value));
  }
  if (writer) {
    writer->finish();
    write_hf_side_files(dir, config ? config : "", data_.tokenizer().source_file());
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

std::string Session::export_adapter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create " + dir + ": " + ec.message());
  at::NoGradGuard no_grad;
  bool written = false;
  StrategyChain(plugins_.strategies)
      .each_with(
          &tf_strategy_vtable::export_adapter, "export_adapter",
          [&](size_t i, tf_status st) {
            written = written || st == TF_OK;
            check_plugin_status(st, plugins_.strategies[i], "export_adapter");
          },
          dir.c_str());
  if (!written)
    throw std::runtime_error(
        "no strategy of this recipe has adapters to export (add a [[strategy]] with plugin = "
        "\"lora\"), or export the whole model without --adapter");
  return dir;
}

}  // namespace tightfit
