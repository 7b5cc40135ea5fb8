#include "session.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "cross_entropy.hpp"
#include "cuda_memory.hpp"
#include "data_setup.hpp"
#include "device_spec.hpp"
#include "file_util.hpp"
#include "generation.hpp"
#include "hf_shards.hpp"
#include "hf_weights.hpp"
#include "kernel_keys.hpp"
#include "logging.hpp"
#include "op_timer.hpp"
#include "safetensors.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
namespace fs = std::filesystem;

Session::Session(const Recipe& recipe, const PluginRegistry& registry, SessionOptions options)
    : recipe_(recipe), options_(std::move(options)) {
  try {
    build(registry);
  } catch (const c10::Error& e) {
    if (auto refusal = budget_refusal(e)) throw OutOfBudgetError(*refusal);
    throw;
  }
}

Session::~Session() {
  auto destroy = [](PluginInstance& inst, auto destroy_fn) {
    if (inst.plugin && inst.state && destroy_fn) destroy_fn(inst.state);
    inst.state = nullptr;
  };
  destroy(schedule_, schedule_.plugin ? schedule_.plugin->schedule()->destroy : nullptr);
  for (auto& s : strategies_) destroy(s, s.plugin->strategy()->destroy);
  destroy(model_, model_.plugin ? model_.plugin->model()->destroy : nullptr);
}

void Session::log(tf_log_level level, const std::string& message) {
  if (options_.on_log) options_.on_log(message);
  log_message(level, message);
}

void Session::check(tf_status status, const PluginInstance& inst, const char* what) {
  check_plugin_status(status, inst, what);
}

void check_plugin_status(tf_status status, const PluginInstance& inst, const char* what) {
  if (status == TF_OK || status == TF_NOT_HANDLED) return;
  std::string msg = inst.ctx->plugin_error;
  if (msg.empty()) msg = inst.ctx->last_error;
  if (msg.empty()) msg = "status " + std::to_string(static_cast<int>(status));
  inst.ctx->plugin_error.clear();
  inst.ctx->last_error.clear();
  // A budget refusal a host service reported may come back from the plugin
  // as a generic error: the service recorded it.
  const std::string refusal = std::exchange(inst.ctx->budget_refusal, std::string());
  if (!refusal.empty()) throw OutOfBudgetError(refusal);
  if (status == TF_ERR_OUT_OF_MEMORY) throw OutOfBudgetError(msg);
  throw PluginCallError(inst.ctx->role + " plugin \"" + inst.plugin->name + "\" failed in " + what +
                        ": " + msg);
}

std::string Session::checkpoint_dir() const {
  const std::string d = save_cfg_.get_string("dir");
  return d.empty() ? (fs::path(run_dir_) / "checkpoints").string() : d;
}

Batcher::Batch Session::next_batch() {
  Batcher::Batch b = batcher_->next();
  if (run_info_.world_size > 1) {
    const int64_t rows = b.tokens.size(0) / run_info_.world_size;
    b.tokens = b.tokens.narrow(0, run_info_.rank * rows, rows).contiguous();
    b.targets = b.targets.narrow(0, run_info_.rank * rows, rows).contiguous();
    if (b.positions.defined())
      b.positions = b.positions.narrow(0, run_info_.rank * rows, rows).contiguous();
  }
  return b;
}

MemorySnapshot Session::memory_snapshot() const {
  MemorySnapshot m = MemoryAccounting::instance().snapshot();
  CudaMemory c;
  if (device_.is_cuda() && cuda_memory(device_.has_index() ? device_.index() : 0, &c)) {
    m.device_current = c.allocated;
    m.device_peak = c.peak_allocated;
  }
  return m;
}

void Session::write_op_profile(const OpTimer& timer, double wall_s) const {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& [name, s] : timer.by_name()) ops.push_back({{"op", name}, {"seconds", s}});
  nlohmann::json j = {{"wall_s", wall_s}, {"inside_ops_s", timer.seconds()}, {"ops", ops}};
  write_file_synced((fs::path(run_dir_) / "profile.json").string(), j.dump(1));
}

double Session::eval_loss(int64_t batches) {
  if (batches <= 0) return std::nan("");
  at::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    auto b = batcher_->validation(i);
    at::Tensor logits = forward_logits(b.tokens.to(device_), /*training=*/false, b.positions);
    sum += cross_entropy_mean(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                              b.targets.to(logits.device()).reshape({-1}))
               .item<double>();
  }
  return sum / static_cast<double>(batches);
}

std::string Session::generate(const std::string& prompt, int64_t n_tokens, int64_t top_k,
                              double temperature, uint64_t seed, double top_p, bool use_cache,
                              const std::vector<int64_t>& stop_ids) {
  return generate_text(
      *this, prompt,
      SamplingOptions{n_tokens, top_k, temperature, top_p, seed, use_cache, stop_ids});
}

}  // namespace tightfit
