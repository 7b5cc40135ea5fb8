// The stage executor: runs the model as a sequence of stages, raises hook
// events around each in forward, backward and recompute, and offers the
// generic autograd Function that checkpointing (and any strategy that must
// re-run a stage in backward) relies on.
#include "executor.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <optional>

#include "host_reads.hpp"
#include "plugin_hooks.hpp"
#include "strategy_chain.hpp"
#include "tensor_handle.hpp"

namespace tightfit {
namespace {

// Runs a stage without keeping its activations, and re-runs it in backward
// with the same random state (as torch.utils.checkpoint's reentrant variant).
// `anchor` requires grad so that the stage gets a backward even when its
// input (token ids) does not.
struct StageRecompute : public torch::autograd::Function<StageRecompute> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& anchor, Executor* executor, int64_t stage) {
    (void)anchor;
    ctx->saved_data["stage"] = stage;
    ctx->saved_data["executor"] = reinterpret_cast<int64_t>(executor);
    const at::Device dev = input.device();
    at::Generator gen = at::globalContext().defaultGenerator(dev);
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    // A strategy may keep the input elsewhere until backward (activation offload).
    int64_t packer = -1;
    uint64_t key = 0;
    if (input.is_floating_point())
      packer = executor->pack_activation(static_cast<int32_t>(stage), input, &key);
    if (packer >= 0) {
      ctx->saved_data["packer"] = packer;
      ctx->saved_data["key"] = static_cast<int64_t>(key);
    } else {
      ctx->save_for_backward({input});
    }
    return executor->run_stage(static_cast<int32_t>(stage), input, /*training=*/true,
                               /*recompute=*/false);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* executor = reinterpret_cast<Executor*>(ctx->saved_data["executor"].toInt());
    const auto stage = static_cast<int32_t>(ctx->saved_data["stage"].toInt());
    at::Tensor x;
    if (ctx->saved_data.count("packer"))
      x = executor->unpack_activation(static_cast<int32_t>(ctx->saved_data["packer"].toInt()),
                                      stage, static_cast<uint64_t>(ctx->saved_data["key"].toInt()));
    else
      x = ctx->get_saved_variables()[0].detach();
    if (at::isFloatingType(x.scalar_type())) x.requires_grad_(true);

    at::Generator gen = at::globalContext().defaultGenerator(x.device());
    at::Tensor current_rng;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      current_rng = gen.get_state();
      gen.set_state(ctx->saved_data["rng"].toTensor());
    }
    at::Tensor out;
    std::vector<at::Tensor> terms;
    {
      at::AutoGradMode enable(true);
      CategoryScope scope(TF_MEM_ACTIVATIONS);
      executor->raise_stage_event(stage, TF_PHASE_RECOMPUTE, true);
      out = executor->recompute_stage(stage, x, &terms);
      executor->raise_stage_event(stage, TF_PHASE_RECOMPUTE, false);
    }
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(current_rng);
    }
    // The loss terms the stage made again get their gradient here: in the
    // forward, run without autograd, they had none.
    std::vector<at::Tensor> outputs, seeds;
    if (out.requires_grad()) outputs.push_back(out), seeds.push_back(grads[0]);
    for (const at::Tensor& t : terms)
      if (t.requires_grad())
        outputs.push_back(t), seeds.push_back(at::full_like(t, executor->loss_term_seed()));
    if (!outputs.empty()) torch::autograd::backward(outputs, seeds);
    at::Tensor gx = x.requires_grad() ? x.grad() : at::Tensor();
    return {gx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int32_t Executor::pack_activation(int32_t stage, const at::Tensor& x, uint64_t* key) {
  // (the loader refuses a strategy with only one of the pair)
  return StrategyChain(plugins_.strategies)
      .first_handled(TF_STRATEGY_HOOK(pack_activation), stage, borrow_handle(x), key);
}

at::Tensor Executor::unpack_activation(int32_t strategy, int32_t stage, uint64_t key) {
  PluginInstance& s = plugins_.strategies.at(static_cast<size_t>(strategy));
  tf_tensor out = nullptr;
  check_plugin_status(guarded_call(s, "unpack_activation", s.plugin->strategy()->unpack_activation,
                                   stage, key, &out),
                      s, "unpack_activation");
  return adopt_handle(StrategyChain::returned(out, s, "unpack_activation"));
}

void Executor::raise_stage_event(int32_t stage, tf_pass_phase phase, bool begin) {
  // Which stages are inside an event: their weights are in use, and
  // strategies that keep weights elsewhere have brought them in.
  if (stage >= 0) {
    if (active_events_.size() < stages_.size()) active_events_.resize(stages_.size(), 0);
    active_events_[static_cast<size_t>(stage)] += begin ? 1 : -1;
  }
  tf_stage_event ev{sizeof(tf_stage_event), stage, phase, begin ? 1 : 0, step_};
  StrategyChain(plugins_.strategies)
      .each(TF_STRATEGY_HOOK(stage_event), static_cast<const tf_stage_event*>(&ev));
}

at::Tensor Executor::run_stage(int32_t stage, const at::Tensor& input, bool training,
                               bool recompute) {
  tf_stage_call call{sizeof(tf_stage_call),
                     stage,
                     training ? 1 : 0,
                     recompute ? 1 : 0,
                     step_,
                     nullptr,
                     stage == pass_->fused_head ? 1 : 0,
                     nullptr};
  const at::Device stage_device(stages_[static_cast<size_t>(stage)].device);
  at::Tensor positions = pass_->rows.positions;
  if (positions.defined()) {
    if (positions.device() != stage_device) positions = positions.to(stage_device);
    call.positions = borrow_handle(positions);
  }
  at::Tensor mask = pass_->rows.attention_mask;
  if (mask.defined()) {
    if (mask.device() != stage_device) mask = mask.to(stage_device);
    call.attention_mask = borrow_handle(mask);
  }
  PassScope in_stage = *pass_;  // its weights come to its device
  in_stage.compute_device = stage_device;
  const EnteredPass entered(*this, in_stage);
  tf_tensor out = nullptr;
  const tf_model_vtable* vt = plugins_.model.plugin->model();
  const tf_tensor lent = borrow_handle(input);
  check_plugin_status(
      call_hook(plugins_.model, vt, TF_MODEL_HOOK(stage_forward), &call, lent, &out),
      plugins_.model, "stage_forward");
  if (out == nullptr)
    throw PluginCallError("model plugin \"" + plugins_.model.plugin->name +
                          "\" returned no tensor for stage " +
                          stages_[static_cast<size_t>(stage)].name);
  return adopt_handle(StrategyChain::returned(out, plugins_.model, "stage_forward", lent));
}

at::Tensor Executor::recompute_stage(int32_t stage, const at::Tensor& input,
                                     std::vector<at::Tensor>* terms) {
  PassScope rerun = *pass_;
  rerun.recompute_terms = terms;
  const EnteredPass entered(*this, rerun);
  return run_stage(stage, input, /*training=*/true, /*recompute=*/true);
}

at::Tensor Executor::forward_logits(const at::Tensor& tokens, bool training, const PassRows& rows) {
  PassScope whole_logits = *pass_;
  whole_logits.fused_head = -1;
  const EnteredPass entered(*this, whole_logits);
  return forward_stages(tokens, training, rows, nullptr);
}

at::Tensor Executor::forward_stages(const at::Tensor& tokens, bool training, const PassRows& rows,
                                    LossRequest* loss) {
  const at::Tensor& positions = rows.positions;
  if (positions.defined()) {
    if (!(plugins_.model.plugin->model_features & TF_MODEL_FEATURE_POSITIONS))
      throw PluginCallError("model plugin \"" + plugins_.model.plugin->name +
                            "\" does not read per-token positions "
                            "(TF_MODEL_FEATURE_POSITIONS), so packed rows would attend across "
                            "examples: set [data] packing = false");
    if (positions.sizes() != tokens.sizes() || positions.scalar_type() != at::kLong)
      throw std::invalid_argument("positions must be int64 of the tokens' shape [B, T]");
  }
  const at::Tensor& mask = rows.attention_mask;
  if (mask.defined() && (mask.sizes() != tokens.sizes() || mask.scalar_type() != at::kLong))
    throw std::invalid_argument("attention_mask must be int64 of the tokens' shape [B, T]");
  PassRows on_device = rows;
  if (positions.defined()) on_device.positions = positions.to(env_.device);
  if (mask.defined()) on_device.attention_mask = mask.to(env_.device);
  PassScope pass = *pass_;
  pass.rows = std::move(on_device);
  const EnteredPass entered(*this, pass);
  CategoryScope scope(TF_MEM_ACTIVATIONS);
  const bool grad = at::GradMode::is_enabled();
  const bool hooks = std::any_of(plugins_.strategies.begin(), plugins_.strategies.end(),
                                 [](const PluginInstance& s) {
                                   return s.plugin->strategy()->stage_event != nullptr ||
                                          s.plugin->strategy()->grad_ready != nullptr;
                                 });
  at::Tensor h = tokens;
  for (size_t i = 0; i < stages_.size(); ++i) {
    const StageState& st = stages_[i];
    if (st.skip) continue;
    const auto idx = static_cast<int32_t>(i);
    const at::Device dev(st.device);
    if (h.device() != dev) h = h.to(dev);
    raise_stage_event(idx, TF_PHASE_FORWARD, true);
    if (!copies_prefix_.empty()) expect_stage_copies(idx);
    if (grad && training && st.recompute)
      h = StageRecompute::apply(h, recompute_anchor_, this, static_cast<int64_t>(idx));
    else
      h = run_stage(idx, h, training, false);
    if (loss != nullptr && idx == pass_->fused_head) h = head_loss(idx, h, *loss);
    raise_stage_event(idx, TF_PHASE_FORWARD, false);
    if (grad && hooks && h.requires_grad()) {
      // Gradient w.r.t. this stage's output arriving = its backward begins
      // and the following stage's backward has ended.
      int32_t next_stage = -1;
      for (size_t j = i + 1; j < stages_.size(); ++j)
        if (!stages_[j].skip) {
          next_stage = static_cast<int32_t>(j);
          break;
        }
      h.register_hook([this, idx, next_stage](const at::Tensor& g) {
        if (next_stage >= 0) {
          raise_stage_event(next_stage, TF_PHASE_BACKWARD, false);
          dispatch_grads(next_stage);
        }
        raise_stage_event(idx, TF_PHASE_BACKWARD, true);
        return g;
      });
    }
  }
  return h;
}

PassResult Executor::run_pass(const at::Tensor& tokens_in, const at::Tensor& targets_in,
                              bool backward, double loss_scale, const PassRows& rows_in,
                              const PendingReads::Fill& deferred) {
  PassResult r;
  const at::Tensor tokens = tokens_in.to(env_.device);
  PassRows rows = rows_in;
  if (rows.positions.defined()) rows.positions = rows.positions.to(env_.device);
  if (rows.attention_mask.defined()) rows.attention_mask = rows.attention_mask.to(env_.device);
  // Backward recomputes checkpointed stages: they see the same rows, and a
  // fused head again gives its hidden state.
  PassScope pass = *pass_;
  pass.rows = rows;
  pass.fused_head = fusable_head();
  const EnteredPass entered(*this, pass);
  // The fused head's gradients are made in forward: it needs the scale the
  // loss will have in backward.
  const double strategies_scale = backward ? strategies_loss_scale() : 1.0;
  at::Tensor loss;
  {
    at::AutoGradMode mode(backward);
    loss = forward_loss(tokens, targets_in, /*training=*/true, rows, loss_scale * strategies_scale);
  }
  at::Tensor reported = loss.detach();
  if (env_.pg) {
    // Every rank reports (and its schedule decides on) the global batch's
    // loss: averaged on the device, then read once.
    reported = reported.to(at::kDouble).reshape({1}).clone();
    env_.pg->all_reduce(reported, ReduceOp::Avg);
  }
  r.n_tokens = tokens.numel();
  // Testing aid ([run] debug_nan_at_steps): a NaN loss, once per listed step.
  if (backward && nan_steps_pending_.erase(step_)) {
    loss = loss * std::numeric_limits<double>::quiet_NaN();
    reported = reported * std::numeric_limits<double>::quiet_NaN();
  }
  if (deferred && pending_reads_.is_open()) {
    pending_reads_.add(reported, deferred);  // read with the update's norm
  } else {
    r.loss = pending_reads_.read_with({reported})[0];
    r.finite = std::isfinite(r.loss);
    if (deferred) deferred(r.loss);  // outside a step: read now
  }
  if (!backward) return r;
  backward_pass(loss, loss_scale, strategies_scale);
  return r;
}

void Executor::backward_pass(const at::Tensor& loss, double loss_scale, double strategies_scale) {
  grads_dispatched_.assign(store_.all().size(), false);
  applied_loss_scale_ = strategies_scale;
  term_seed_ = loss_scale * strategies_scale * pass_->term_weight;
  {
    CategoryScope scope(TF_MEM_TRANSIENT);
    (loss * (loss_scale * applied_loss_scale_)).backward();
  }
  // The first stage's backward ends when backward returns.
  for (size_t i = 0; i < stages_.size(); ++i)
    if (!stages_[i].skip) {
      raise_stage_event(static_cast<int32_t>(i), TF_PHASE_BACKWARD, false);
      break;
    }
  dispatch_grads(-1);
}

void Executor::dispatch_grads(int32_t stage) {
  auto& acct = MemoryAccounting::instance();
  auto& params = store_.all();
  grads_dispatched_.resize(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    Param& p = params[i];
    // Shared parameters (stage -1) are complete only when backward returns.
    if ((stage >= 0 && p.stage != stage) || grads_dispatched_[i] || !p.value.defined() ||
        !p.value.grad().defined())
      continue;
    grads_dispatched_[i] = true;
    acct.retag(p.value.grad(), TF_MEM_GRADS);
    const int taker = StrategyChain(plugins_.strategies)
                          .first_handled(TF_STRATEGY_HOOK(grad_ready), p.name.c_str(),
                                         borrow_handle(p.value.grad()));
    if (taker < 0) continue;
    if (applied_loss_scale_ != 1.0)
      throw PluginCallError(
          "strategy \"" + plugins_.strategies[static_cast<size_t>(taker)].plugin->name +
          "\" consumed the gradient of " + p.name + " in grad_ready while the loss is scaled by " +
          std::to_string(applied_loss_scale_) +
          " (fp16 loss scaling): the scaled gradient is not the real one and may hold "
          "infinities. fp16 loss scaling does not combine with it; use precision dtype = "
          "\"bf16\", which needs no scaling");
    p.value.mutable_grad() = at::Tensor();  // consumed: its memory goes now
  }
}

double Executor::strategies_loss_scale() {
  double scale = 1.0;
  StrategyChain(plugins_.strategies).each(TF_STRATEGY_HOOK(loss_scale), &scale);
  if (!(scale > 0) || !std::isfinite(scale))
    throw PluginCallError("strategies asked for a loss scale of " + std::to_string(scale) +
                          "; it must be finite and > 0");
  return scale;
}

bool Executor::stage_in_use(int32_t stage) const {
  return stage >= 0 && static_cast<size_t>(stage) < active_events_.size() &&
         active_events_[static_cast<size_t>(stage)] > 0;
}

void Executor::with_resident(Param& p, const std::function<void()>& fn) {
  if (p.kept_by_host || p.residency == TF_TIER_DEVICE || p.stage < 0 || stage_in_use(p.stage))
    return fn();
  // Outside its stage's events (export, checkpoints, snapshots, decoding) a
  // parameter kept in another tier is brought in for this access only.
  raise_stage_event(p.stage, TF_PHASE_ACCESS, true);
  try {
    fn();
  } catch (...) {
    raise_stage_event(p.stage, TF_PHASE_ACCESS, false);
    throw;
  }
  raise_stage_event(p.stage, TF_PHASE_ACCESS, false);
}

std::string Executor::read_name(const std::string& name) const {
  if (copies_prefix_.empty()) return name;
  std::string copy = copies_prefix_ + name;
  return store_.find(copy) != nullptr ? copy : name;
}

at::Tensor Executor::fetch_weight(const std::string& name) {
  Param& p = store_.get(read_name(name));
  std::string reuse_key;
  if (reused_weights_ != nullptr && !p.trainable &&
      (p.format != TF_FORMAT_DENSE || p.residency != TF_TIER_DEVICE)) {
    const at::DeviceType dev = p.value.defined() ? p.value.device().type() : env_.device.type();
    reuse_key =
        p.name + (at::autocast::is_autocast_enabled(dev)
                      ? std::string(" in ") + c10::toString(at::autocast::get_autocast_dtype(dev))
                      : std::string());
    if (const auto it = reused_weights_->find(reuse_key); it != reused_weights_->end())
      return it->second;
  }
  at::Tensor w = fetch_weight_once(p);
  if (!reuse_key.empty()) reused_weights_->emplace(reuse_key, w);
  return w;
}

at::Tensor Executor::fetch_weight_once(Param& p) {
  at::Tensor w;
  if (p.kept_by_host) {
    // Taken as the first pass that reads one finds the weights (the
    // schedule's reference model: before the first update).
    if (!p.value.defined()) store_.take_kept_copies();
    // In pinned host memory: to the device its parameter lives on, for this read.
    w = p.value.is_pinned()
            ? p.value.to(store_.get(p.copy_of).value.device(), /*non_blocking=*/true)
            : p.value;
  } else if (p.residency == TF_TIER_DEVICE || stage_in_use(p.stage))
    w = fetch_resident(p);
  else  // a copy: the tier may free the resident bytes when the access ends
    with_resident(p, [&] { w = fetch_resident(p).detach().clone(); });
  if (pass_->compute_device && w.device() != *pass_->compute_device)
    w = w.to(*pass_->compute_device);
  return w;
}

// A pass over the copies (a reference model's) names each stage's copies
// as the stage begins: a tier that leaves them out of the stage's event
// (TF_PARAM_COPY, as offload does) may read them ahead of their fetch.
void Executor::expect_stage_copies(int32_t stage) {
  if (const auto it = copied_by_stage_.find(stage); it != copied_by_stage_.end())
    expect_weights(it->second);
}

void Executor::use_param_copies(const std::string& prefix) {
  copies_prefix_ = prefix;
  if (prefix.empty() || prefix == copied_by_stage_prefix_) return;
  copied_by_stage_.clear();
  for (const Param& p : store_.all())
    if (!p.copy_of.empty() && p.name.rfind(prefix, 0) == 0)
      copied_by_stage_[p.stage].push_back(p.copy_of);
  copied_by_stage_prefix_ = prefix;
}

void Executor::expect_weights(const std::vector<std::string>& names) {
  for (const std::string& asked : names) {
    const std::string name = read_name(asked);
    const Param& p = store_.get(name);
    if (!p.kept_by_host && p.residency != TF_TIER_DEVICE && p.value.numel() == 0 && p.numel() > 0 &&
        stage_in_use(p.stage))
      StrategyChain(plugins_.strategies)
          .first_handled(TF_STRATEGY_HOOK(expect_weight), name.c_str());
  }
}

at::Tensor Executor::fetch_resident(Param& p) {
  const std::string& name = p.name;
  // Left in its tier through the stage's event (offload's experts, ABI
  // 1.15): the strategy that keeps it brings it in now.
  if (p.residency != TF_TIER_DEVICE && p.value.numel() == 0 && p.numel() > 0)
    StrategyChain(plugins_.strategies).first_handled(TF_STRATEGY_HOOK(want_weight), name.c_str());
  if (std::optional<at::Tensor> w =
          StrategyChain(plugins_.strategies)
              .first_tensor(TF_STRATEGY_HOOK(fetch_weight), name.c_str(), borrow_handle(p.value)))
    return *std::move(w);
  if (p.format != TF_FORMAT_DENSE)
    throw PluginCallError("parameter \"" + name +
                          "\" is stored in a compact format but no strategy served fetch_weight");
  if (p.value.numel() != p.numel() || (p.numel() > 0 && p.value.storage().nbytes() == 0))
    throw PluginCallError("parameter \"" + name + "\" lives in the " +
                          (p.residency == TF_TIER_DISK      ? "disk"
                           : p.residency == TF_TIER_SHARDED ? "sharded"
                                                            : "host") +
                          " tier and the strategy that put it there did not bring it in for its "
                          "stage");
  return p.value;
}

}  // namespace tightfit
