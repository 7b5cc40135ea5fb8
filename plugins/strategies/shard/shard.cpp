// shard: one model over several devices or ranks, on torch.distributed's
// c10d (the kernel owns the process group and lends its collectives).
//
// mode = "layers": pipeline placement in one process. Stages go to devices
// (`devices`, `split` = blocks per device; embed with the first, head with
// the last); the kernel keeps each stage's parameters on its device and moves
// activations at the boundaries.
//
// mode = "data": data parallel. Each rank runs its rows of the global batch;
// every gradient is averaged over ranks (all-reduce) as soon as its stage's
// backward ends, so communication overlaps the rest of backward.
//
// mode = "zero": ZeRO (Rajbhandari et al.). Parameters and gradients are
// flattened and split into world_size equal parts (partition.hpp).
//   stage 1: gradients all-reduced as in data mode; each rank keeps the
//            optimizer state of its part only, updates its part and the
//            parts are all-gathered back into the parameter.
//   stage 2: gradients are reduce-scattered instead: each rank keeps the
//            averaged gradient of its part only (the full gradient is freed
//            at once), and global-norm clipping sums the parts over ranks.
//   stage 3: parameters too: each rank keeps its part of every dense weight
//            of the model's stages (tied weights shared by several stages
//            stay whole); a stage's weights are all-gathered when its
//            forward, recompute or backward begins and their bytes freed
//            when it ends (the tensor stays the same autograd leaf, as FSDP
//            does), and each rank updates its part in place.
// Optimizer state (and stage 3's parameter parts) is checkpointed per rank
// and re-split on load, so a run saved by N ranks resumes on any number.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "partition.hpp"
#include "tightfit/plugin_sdk.hpp"
#include "tightfit/storage_bytes.hpp"

namespace {

// A parameter split across ranks (stage 3).
struct Sharded {
  at::Tensor leaf;       // the parameter: shape and autograd identity stay, bytes come and go
  at::Tensor own;        // this rank's part, padded to the chunk: the master copy
  int64_t version = -1;  // the leaf's at gather; a change means it was written to
};

struct Shard {
  explicit Shard(tf_sdk::Host h) : host(h) {}
  tf_sdk::Host host;
  std::string mode;
  int64_t zero_stage = 1;
  int rank = 0, world = 1;
  at::Device device{at::kCPU};  // the run's
  // zero: optimizer state and (stage 2) the reduced gradient of this rank's
  // part of each parameter, by name.
  std::map<std::string, std::vector<at::Tensor>> state;
  std::map<std::string, at::Tensor> held;
  std::vector<std::string> held_order;  // the order gradients arrived: the same on every rank
  // stage 3
  std::map<std::string, Sharded> sharded;
  std::map<int32_t, std::vector<std::string>> by_stage;
  std::map<int32_t, int> in_use;  // stage events begun and not yet ended

  bool params_split() const { return mode == "zero" && zero_stage >= 3; }

  // Keeps this rank's part of each dense weight of `stage` (all stages when
  // < 0) and frees the rest of its bytes.
  void split_stage(int32_t stage) {
    for (const auto& name : host.param_names()) {
      const tf_param_info info = host.param_info(name);
      if (info.stage < 0 || (stage >= 0 && info.stage != stage) || sharded.count(name) ||
          info.format != TF_FORMAT_DENSE || info.residency != TF_TIER_DEVICE ||
          info.stored_bytes == 0 || !at::isFloatingType(tf_sdk::scalar_type(info.dtype)))
        continue;
      at::Tensor value = host.param_storage(name);
      if (!value.is_contiguous()) continue;
      const shard::Part pt = part(value);
      Sharded w;
      {
        const tf_sdk::MemoryCategory scope(host, TF_MEM_WEIGHTS);
        w.own = at::zeros({pt.chunk}, value.options().requires_grad(false));
      }
      if (pt.len > 0)
        w.own.narrow(0, 0, pt.len).copy_(value.detach().view({-1}).narrow(0, pt.lo, pt.len));
      host.set_param_storage(name, value, TF_FORMAT_DENSE, TF_TIER_SHARDED);
      w.leaf = host.param_storage(name);
      tf_sdk::free_bytes(w.leaf);
      by_stage[info.stage].push_back(name);
      sharded.emplace(name, std::move(w));
    }
  }

  // Every rank's `part` (its share, padded to the chunk) into `dst`, the
  // whole tensor flattened: straight into it when the parts fill it exactly.
  // (The backend's own buffers count as transient too.)
  void all_gather_into(at::Tensor& dst, const at::Tensor& part) {
    const tf_sdk::MemoryCategory scope(host, TF_MEM_TRANSIENT);
    if (dst.numel() == part.numel() * world) {
      host.all_gather(dst, part);
      return;
    }
    at::Tensor all = at::empty({part.numel() * world}, part.options());
    host.all_gather(all, part);
    dst.copy_(all.narrow(0, 0, dst.numel()));
  }

  // All ranks' parts into the leaves of `stage`.
  void gather(int32_t stage) {
    for (const auto& name : by_stage[stage]) {
      Sharded& w = sharded.at(name);
      if (tf_sdk::has_bytes(w.leaf)) continue;
      {
        const tf_sdk::MemoryCategory scope(host, TF_MEM_WEIGHTS);
        tf_sdk::allocate_bytes(w.leaf);
      }
      // Written through variable_data(): tensors autograd saved are this
      // leaf and must still count as unmodified.
      at::Tensor dst = w.leaf.variable_data().view({-1});
      all_gather_into(dst, w.own);
      w.version = w.leaf._version();
    }
  }

  // Frees the leaves of `stage`; a leaf written to in place (a snapshot
  // restored, a perturbation) first gives this rank's part back.
  void release(int32_t stage) {
    for (const auto& name : by_stage[stage]) {
      Sharded& w = sharded.at(name);
      if (!tf_sdk::has_bytes(w.leaf)) continue;
      if (w.leaf._version() != w.version) {
        const shard::Part pt = part(w.leaf);
        if (pt.len > 0)
          w.own.narrow(0, 0, pt.len).copy_(w.leaf.detach().view({-1}).narrow(0, pt.lo, pt.len));
      }
      tf_sdk::free_bytes(w.leaf);
    }
  }

  shard::Part part(const at::Tensor& t) const { return shard::part_of(t.numel(), rank, world); }

  int32_t n_state() const { return host.optimizer_info().n_state; }

  bool last_micro_batch() const {
    const auto [index, count] = host.micro_batch();
    return index + 1 == count;
  }

  // The optimizer state of a parameter's part, zero before its first update.
  std::vector<at::Tensor>& state_of(const std::string& name, int64_t len,
                                    const at::Device& device) {
    auto& slots = state[name];
    if (slots.empty()) {
      const tf_sdk::MemoryCategory scope(host, TF_MEM_OPTIMIZER);
      for (int32_t i = 0; i < n_state(); ++i)
        slots.push_back(at::zeros({len}, at::TensorOptions().dtype(at::kFloat).device(device)));
    }
    return slots;
  }

  // The run's optimizer on this rank's part of a parameter: `p` (a view,
  // updated in place) from `g`, with the part's own state.
  void update_slice(const std::string& name, at::Tensor p, at::Tensor g) {
    at::NoGradGuard no_grad;
    host.optimizer_update(name, p, g, state_of(name, p.numel(), p.device()));
  }

  // Updates this rank's part of `param` from `grad_part` (its part of the
  // averaged gradient), then all-gathers the parts into the whole parameter.
  void update_part(const std::string& name, const at::Tensor& param, const at::Tensor& grad_part) {
    at::NoGradGuard no_grad;
    const shard::Part pt = part(param);
    at::Tensor flat = param.detach().view({-1});
    if (pt.len > 0)
      update_slice(name, flat.narrow(0, pt.lo, pt.len), grad_part.narrow(0, 0, pt.len));
    if (world == 1) return;
    at::Tensor mine;
    {
      const tf_sdk::MemoryCategory scope(host, TF_MEM_TRANSIENT);
      mine = at::zeros({pt.chunk}, flat.options());
    }
    if (pt.len > 0) mine.narrow(0, 0, pt.len).copy_(flat.narrow(0, pt.lo, pt.len));
    all_gather_into(flat, mine);
  }
};

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<Shard>(tf_sdk::Host(api, ctx));
    s->mode = s->host.get_string("mode");
    s->zero_stage = s->host.get_int("stage");
    const tf_run_info info = s->host.run_info();
    s->rank = info.rank;
    s->device = at::Device(info.device);
    s->world = info.world_size;
    if (s->mode != "zero" && s->host.has("stage"))
      throw std::invalid_argument("shard: `stage` is for mode = \"zero\" (this is mode = \"" +
                                  s->mode + "\")");
    if (s->mode != "layers" && (s->host.has("devices") || s->host.has("split")))
      throw std::invalid_argument("shard: `devices` and `split` are for mode = \"layers\"");
    if (s->mode != "layers" &&
        (!TF_HAS(api, tf_host_api, dist_all_reduce) || !TF_HAS(api, tf_host_api, micro_batch)))
      throw std::invalid_argument("shard: this tightfit host has no collectives; update it");
    if (s->mode == "layers" && s->world > 1)
      s->host.log(TF_LOG_WARN,
                  "shard: mode = \"layers\" splits the model inside each process; with " +
                      std::to_string(s->world) + " ranks every rank holds the whole model");
    *out = s.release();
    return TF_OK;
  });
}

// layers: a device per stage. `split` gives blocks per device; without it the
// blocks are spread evenly.
tf_status configure(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Shard*>(state);
  if (s->mode != "layers") return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    std::vector<int32_t> blocks;
    const int32_t n_stages = s->host.stage_count();
    for (int32_t i = 0; i < n_stages; ++i)
      if (s->host.stage_info(i).kind == TF_STAGE_BLOCK) blocks.push_back(i);
    std::vector<std::string> devices = s->host.get_string_list("devices");
    std::vector<int64_t> split = s->host.get_int_list("split");
    if (devices.empty()) {
      if (split.empty())
        throw std::invalid_argument("shard: mode = \"layers\" needs `devices` or `split`");
      for (size_t d = 0; d < split.size(); ++d)
        devices.push_back(s->device.is_cuda() ? "cuda:" + std::to_string(d) : s->device.str());
    }
    if (split.empty()) {
      const auto n = static_cast<int64_t>(devices.size());
      for (int64_t d = 0; d < n; ++d)
        split.push_back(static_cast<int64_t>(blocks.size()) * (d + 1) / n -
                        static_cast<int64_t>(blocks.size()) * d / n);
    }
    if (split.size() != devices.size())
      throw std::invalid_argument("shard: `split` has " + std::to_string(split.size()) +
                                  " entries but `devices` " + std::to_string(devices.size()));
    int64_t total = 0;
    for (int64_t k : split) total += k;
    if (total != static_cast<int64_t>(blocks.size()))
      throw std::invalid_argument("shard: `split` assigns " + std::to_string(total) +
                                  " blocks but the model has " + std::to_string(blocks.size()));
    for (const auto& d : devices) {
      std::optional<at::Device> dev;
      try {
        dev = at::Device(d);
      } catch (const c10::Error&) {
        throw std::invalid_argument("shard: \"" + d + "\" is not a device (cpu, cuda:N)");
      }
      if (tf_sdk::planning_only(s->host.run_info())) continue;  // planned for other machines
      if (dev->is_cuda() && !at::hasCUDA())
        throw std::invalid_argument("shard: device \"" + d +
                                    "\" but this machine has no CUDA device");
      if (dev->is_cuda() && dev->has_index() &&
          static_cast<size_t>(dev->index()) >= at::getNumGPUs())
        throw std::invalid_argument("shard: device \"" + d + "\" but this machine has " +
                                    std::to_string(at::getNumGPUs()) + " CUDA devices");
    }
    size_t b = 0;
    for (size_t d = 0; d < devices.size(); ++d)
      for (int64_t k = 0; k < split[d]; ++k) s->host.set_stage_device(blocks[b++], devices[d]);
    for (int32_t i = 0; i < n_stages; ++i) {
      const tf_stage_kind kind = s->host.stage_info(i).kind;
      if (kind == TF_STAGE_EMBED) s->host.set_stage_device(i, devices.front());
      if (kind == TF_STAGE_HEAD) s->host.set_stage_device(i, devices.back());
    }
    return TF_OK;
  });
}

// data, zero 1: average the gradient over ranks. zero 2: keep this rank's
// part of the average and free the rest.
tf_status grad_ready(void* state, tf_host_context* ctx, const char* name, tf_tensor grad_h) {
  auto* s = static_cast<Shard*>(state);
  if (s->mode == "layers") return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const at::Tensor& grad = tf_sdk::borrow(grad_h);
    at::NoGradGuard no_grad;
    if (s->mode == "zero" && s->zero_stage >= 2) {
      const shard::Part pt = s->part(grad);
      at::Tensor flat = grad.detach().reshape({-1});
      at::Tensor padded;
      {
        const tf_sdk::MemoryCategory scope(s->host, TF_MEM_TRANSIENT);
        padded = flat;
        if (pt.chunk * s->world != pt.numel) {
          padded = at::zeros({pt.chunk * s->world}, flat.options());
          padded.narrow(0, 0, pt.numel).copy_(flat);
        }
      }
      at::Tensor mine;
      {
        const tf_sdk::MemoryCategory scope(s->host, TF_MEM_GRADS);
        mine = at::empty({pt.chunk}, flat.options());
      }
      s->host.reduce_scatter(mine, padded.contiguous(), TF_REDUCE_AVG);
      auto it = s->held.find(name);
      if (it == s->held.end()) {
        s->held.emplace(name, mine);
        s->held_order.emplace_back(name);
      } else {
        it->second.add_(mine);  // accumulation: the micro-batches' parts add up
      }
      return TF_OK;  // consumed: the kernel frees the full gradient
    }
    if (!s->last_micro_batch()) return TF_NOT_HANDLED;  // reduce once, when complete
    at::Tensor g = grad.detach();
    if (g.is_contiguous()) {
      s->host.all_reduce(g, TF_REDUCE_AVG);
    } else {
      at::Tensor c = g.contiguous();
      s->host.all_reduce(c, TF_REDUCE_AVG);
      g.copy_(c);
    }
    return TF_NOT_HANDLED;  // the kernel (or a later strategy) uses the averaged gradient
  });
}

// zero 3: split each stage's weights as soon as they exist (a model loaded
// stage by stage is never whole on a rank), and whatever is left at the end.
tf_status stage_params_ready(void* state, tf_host_context* ctx, int32_t stage) {
  auto* s = static_cast<Shard*>(state);
  if (!s->params_split()) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->split_stage(stage);
    return TF_OK;
  });
}

// A trained expert weight (or an adapter on one: TF_PARAM_EXPERT, ABI
// 1.15) has a gradient only on the ranks whose tokens were routed to it, so
// the ranks would not make the same collectives: refused rather than hung.
void refuse_trained_experts(const Shard& s) {
  if (s.mode == "layers" || s.world <= 1) return;
  for (const std::string& name : s.host.param_names()) {
    const tf_param_info info = s.host.param_info(name);
    if (info.trainable && (info.flags & TF_PARAM_EXPERT))
      throw std::invalid_argument(
          "shard: mode = \"" + s.mode + "\" averages every gradient over the ranks, but \"" + name +
          "\" belongs to a routed expert, which gets a gradient only on the ranks whose tokens "
          "chose it; trained experts are not supported across ranks yet: freeze the experts "
          "(LoRA targets without gate, up and down) or train on one process");
  }
}

tf_status params_ready(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Shard*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    refuse_trained_experts(*s);
    if (s->params_split()) s->split_stage(-1);
    return TF_OK;
  });
}

// zero 3: a stage's weights are whole only between its events' begin and end.
tf_status stage_event(void* state, tf_host_context* ctx, const tf_stage_event* ev) {
  auto* s = static_cast<Shard*>(state);
  if (!s->params_split() || !s->by_stage.count(ev->stage)) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    int& n = s->in_use[ev->stage];
    if (ev->begin) {
      if (n++ == 0) s->gather(ev->stage);
    } else if (n > 0 && --n == 0) {  // (an end without its begin is ignored)
      s->release(ev->stage);
    }
    return TF_OK;
  });
}

// zero 1: update this rank's part, then gather the parameter.
tf_status optimizer_step_param(void* state, tf_host_context* ctx, const char* name,
                               tf_tensor param_h, tf_tensor grad_h, double) {
  auto* s = static_cast<Shard*>(state);
  if (s->mode != "zero") return TF_NOT_HANDLED;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const at::Tensor& param = tf_sdk::borrow(param_h);
    const at::Tensor& grad = tf_sdk::borrow(grad_h);
    if (!param.is_contiguous())
      throw std::runtime_error(std::string("shard: parameter ") + name + " is not contiguous");
    const shard::Part pt = s->part(param);
    s->update_part(name, param, grad.detach().reshape({-1}).narrow(0, pt.lo, pt.len));
    return TF_OK;
  });
}

// zero 2: the held parts count in the global norm (summed over ranks) ...
tf_status grad_norm_sq(void* state, tf_host_context* ctx, double* sum_sq) {
  auto* s = static_cast<Shard*>(state);
  if (s->mode != "zero" || s->zero_stage < 2) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    at::Tensor sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
    for (const auto& name : s->held_order) {
      const at::Tensor& g = s->held.at(name);
      sq += g.to(at::kDouble).square().sum().cpu();
    }
    at::Tensor t = sq.to(s->device);
    s->host.all_reduce(t, TF_REDUCE_SUM);
    *sum_sq += t.item<double>();
    return TF_OK;
  });
}

// ... and are applied, clipped by the kernel's factor, part by part.
tf_status apply_held_grads(void* state, tf_host_context* ctx, double grad_scale) {
  auto* s = static_cast<Shard*>(state);
  if (s->held_order.empty()) return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    for (const auto& name : s->held_order) {
      at::Tensor g = s->held.at(name);
      if (grad_scale != 1.0) g.mul_(grad_scale);
      if (auto w = s->sharded.find(name); w != s->sharded.end()) {
        // Stage 3: the part is the parameter here; the next use gathers it.
        const shard::Part pt = s->part(w->second.leaf);
        if (pt.len > 0)
          s->update_slice(name, w->second.own.narrow(0, 0, pt.len), g.narrow(0, 0, pt.len));
      } else {
        const at::Tensor param = s->host.param_storage(name);
        s->update_part(name, param, g);
      }
      s->held.erase(name);  // its memory goes as soon as it is applied
    }
    s->held_order.clear();
    return TF_OK;
  });
}

tf_status drop_held_grads(void* state, tf_host_context*) {
  auto* s = static_cast<Shard*>(state);
  s->held.clear();
  s->held_order.clear();
  return TF_OK;
}

// Each rank saves its parts under keys with its rank; load stitches the
// parts of the saving run (any number of ranks) and takes this rank's.
tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Shard*>(state);
  if (s->mode != "zero") return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    s->host.save_double("world_size", s->world);
    for (auto& [name, w] : s->sharded)
      s->host.save_tensor(name + ".part.rank" + std::to_string(s->rank),
                          w.own.narrow(0, 0, s->part(w.leaf).len));
    for (auto& [name, slots] : s->state)
      for (size_t i = 0; i < slots.size(); ++i)
        s->host.save_tensor(name + ".state" + std::to_string(i) + ".rank" + std::to_string(s->rank),
                            slots[i]);
    return TF_OK;
  });
}

// The saving run's parts of one tensor under `key` + ".rank<r>", stitched
// whole; undefined when the checkpoint has none.
at::Tensor stitch(const Shard& s, const std::string& key, int saved_world, int64_t numel) {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < saved_world; ++r) {
    const std::optional<at::Tensor> part =
        s.host.find_saved_tensor(key + ".rank" + std::to_string(r));
    if (!part) return at::Tensor();
    parts.push_back(part->reshape({-1}));
  }
  at::Tensor whole = at::cat(parts);
  if (whole.numel() != numel)
    throw std::runtime_error("shard: the checkpoint's " + key + " has " +
                             std::to_string(whole.numel()) + " elements, the parameter " +
                             std::to_string(numel));
  return whole;
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Shard*>(state);
  if (s->mode != "zero") return TF_OK;
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const std::optional<double> saved = s->host.find_saved_double("world_size");
    if (!saved) {
      if (!s->sharded.empty())
        throw std::runtime_error(
            "shard: this checkpoint was not saved by ZeRO (no per-rank state), so the weights "
            "stage 3 splits cannot be restored from it; resume it without stage = 3");
      return TF_OK;
    }
    const int saved_world = static_cast<int>(*saved);
    for (auto& [name, w] : s->sharded) {
      const at::Tensor whole = stitch(*s, name + ".part", saved_world, w.leaf.numel());
      if (!whole.defined())
        throw std::runtime_error("shard: the checkpoint has no parts of " + name +
                                 " (saved without stage = 3?)");
      const shard::Part pt = s->part(w.leaf);
      at::NoGradGuard no_grad;
      if (pt.len > 0) w.own.narrow(0, 0, pt.len).copy_(whole.narrow(0, pt.lo, pt.len));
    }
    const int n_state = s->n_state();
    s->state.clear();
    const tf_sdk::MemoryCategory scope(s->host, TF_MEM_OPTIMIZER);
    for (const auto& name : s->host.param_names()) {
      const tf_param_info info = s->host.param_info(name);
      std::vector<at::Tensor> slots;
      for (int i = 0; i < n_state; ++i) {
        const at::Tensor whole =
            stitch(*s, name + ".state" + std::to_string(i), saved_world, info.numel);
        if (!whole.defined()) break;  // not updated yet when saved
        const shard::Part pt = shard::part_of(info.numel, s->rank, s->world);
        slots.push_back(whole.narrow(0, pt.lo, pt.len).to(at::kFloat).clone());
      }
      if (static_cast<int>(slots.size()) == n_state && n_state > 0) {
        for (auto& t : slots) t = t.to(s->device);
        s->state[name] = std::move(slots);
      }
    }
    return TF_OK;
  });
}

// zero: optimizer state (stage 1) and gradients (stage 2) shrink to 1/world.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Shard*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->time_factor = 1.0;
    out->time_from_plan = 1;  // tightfit fit prices it from the plan
    // What the ranks exchange each step: the gradients (data parallel), or
    // ZeRO's partitions; a layer split exchanges activations inside a pass.
    if (TF_SDK_REACHES(out, tf_memory_estimate, rank_exchange))
      out->rank_exchange = static_cast<int32_t>(s->mode == "data"   ? 1
                                                : s->mode == "zero" ? 1 + s->zero_stage
                                                                    : 0);
    if (s->mode != "zero" || s->world <= 1) return TF_OK;
    const double keep = 1.0 / s->world;
    const int64_t opt = 4 * static_cast<int64_t>(s->n_state()) * model->n_trainable;
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OPTIMIZER] = -static_cast<int64_t>(opt * (1 - keep));
    if (s->zero_stage >= 2)
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_GRADS] =
          -static_cast<int64_t>(4 * model->n_trainable * (1 - keep));
    if (s->zero_stage >= 3)  // less the stage being computed, which is whole
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_WEIGHTS] =
          -static_cast<int64_t>(static_cast<double>(model->param_bytes) * (1 - keep));
    return TF_OK;
  });
}

// With ranks, `tightfit fit` runs them data parallel or partitions them
// (ZeRO 1, 2, 3); a recipe's layer split stays as it is.
const tf_plugin_search kSearch = {
    .struct_size = sizeof(tf_plugin_search), .flags = TF_SEARCH_PLUGIN_RANKS, .stack_order = 70};
const tf_search_value kModes[] = {
    tf_sdk::search_value("\"data\"", nullptr, nullptr, 0, TF_SEARCH_VALUE_OFF),
    tf_sdk::search_value("\"zero\"", nullptr),
};
const tf_key_search kModeSearch = tf_sdk::key_search(kModes);
const tf_search_value kStages[] = {
    tf_sdk::search_value("1", "zero {}"),
    tf_sdk::search_value("2", "zero {}"),
    tf_sdk::search_value("3", "zero {}"),
};
const tf_key_search kStageSearch = tf_sdk::key_search(kStages, 0, "mode");

const tf_config_key kKeys[] = {
    tf_sdk::searched(tf_sdk::key("mode", TF_VALUE_STRING, "\"data\"",
                                 "layers: stages on devices in one process; data: data parallel "
                                 "(gradient all-reduce); zero: ZeRO partitioning across ranks",
                                 1, 0, "layers|data|zero"),
                     kModeSearch),
    tf_sdk::searched(tf_sdk::key("stage", TF_VALUE_INT, "1",
                                 "zero: 1 partitions optimizer state, 2 also gradients "
                                 "(reduce-scatter), 3 also parameters (gathered per stage)",
                                 1, 3),
                     kStageSearch),
    tf_sdk::key("devices", TF_VALUE_STRING_LIST, "[]",
                "layers: a device per part, e.g. [\"cuda:0\", \"cuda:1\"] or [\"cpu\", \"cpu\"]"),
    tf_sdk::key("split", TF_VALUE_INT_LIST, "[]",
                "layers: blocks per device, e.g. [12, 12]; default: even"),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Shard>,
                                    .configure = configure,
                                    .params_ready = params_ready,
                                    .stage_event = stage_event,
                                    .grad_ready = grad_ready,
                                    .optimizer_step_param = optimizer_step_param,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state,
                                    .stage_params_ready = stage_params_ready,
                                    .grad_norm_sq = grad_norm_sq,
                                    .apply_held_grads = apply_held_grads,
                                    .drop_held_grads = drop_held_grads};

const tf_plugin_descriptor kDescriptor = tf_sdk::searched(
    tf_sdk::describe(
        TF_PLUGIN_STRATEGY, "shard", "1.0.0",
        "one model over several devices (layers) or ranks (data parallel, ZeRO 1/2/3) on c10d",
        kKeys, &kVtable),
    kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
