// Checkpoints: the full training state as safetensors files plus a small JSON
// file per checkpoint, and a manifest naming the complete ones. Written so a
// crash at any moment leaves the last complete checkpoint intact: each
// checkpoint is built in a temporary folder, fsynced, renamed into place, and
// only then added to the manifest (itself replaced by rename).
#include <ATen/core/Generator.h>
#include <c10/util/accumulate.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint_checks.hpp"
#include "checkpoint_manifest.hpp"
#include "file_util.hpp"
#include "input_files.hpp"
#include "json_output.hpp"
#include "safetensors.hpp"
#include "session.hpp"

namespace tightfit {

namespace {
// A plugin's view of checkpoint state (state_out / state_in) ends with the
// save_state or load_state call, however the call ends.
template <class T>
struct NullOnExit {
  T*& ptr;
  ~NullOnExit() { ptr = nullptr; }
};
}  // namespace

namespace fs = std::filesystem;

// Checkpoint keys of the random generators a run draws from.
std::vector<std::pair<std::string, at::Device>> Session::rng_devices() const {
  std::vector<std::pair<std::string, at::Device>> out{{"kernel.rng.cpu", at::Device(at::kCPU)}};
  if (env_.device.is_cuda()) out.emplace_back("kernel.rng.cuda", env_.device);
  return out;
}

// In a multi-process run every rank takes part: rank 0 writes the model,
// optimizer and trainer files; each rank writes its plugins' state (sharded
// optimizer state, for one) to its own file in the same folder, which rank 0
// then moves into place. Ranks share the run folder (one machine, or a
// shared filesystem).
// A save that fails (a full disk, a file size limit, a permission) leaves
// every saved checkpoint as it was: the new one never reached the manifest.
// Its partial folder is removed to give the space back, and the message says
// which checkpoint a --resume will continue from.
std::string Session::save_checkpoint(int64_t step) {
  // Never a checkpoint that holds a NaN or an infinity: it would be the one
  // --resume (and rotation) trust.
  const std::string bad = non_finite_training_state();
  if (!bad.empty()) {
    const fs::path dir = env_.checkpoint_dir();
    const std::vector<std::string> names = read_checkpoint_manifest(dir / "manifest.json");
    throw NonFiniteError("step " + std::to_string(step) + ": " + bad +
                         " holds a NaN or an infinity, so its checkpoint is not saved. " +
                         (names.empty()
                              ? std::string("No earlier checkpoint exists")
                              : "The saved checkpoint " + (dir / names.back()).string() +
                                    " is intact, and `tightfit run --resume` continues from it") +
                         "; lower the learning rate or set optimizer.grad_clip");
  }
  try {
    return write_checkpoint(step);
  } catch (const std::exception& e) {
    const fs::path dir = env_.checkpoint_dir();
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.path().filename().string().rfind(checkpoint_step_name(step) + ".tmp-", 0) == 0 &&
          is_checkpoint_leftover(entry.path()))
        try {
          remove_tree(entry.path().string());
        } catch (const std::exception&) {
          // best effort: the folder is never taken for a checkpoint anyway
        }
    const std::vector<std::string> names = read_checkpoint_manifest(dir / "manifest.json");
    throw std::runtime_error(
        "saving the checkpoint of step " + std::to_string(step) + " failed: " + e.what() + ". " +
        (names.empty() ? std::string("No earlier checkpoint exists")
                       : "The saved checkpoint " + (dir / names.back()).string() +
                             " is intact, and `tightfit run --resume` continues from it") +
        "; free space in " + dir.string() + " (or set [save] dir) first");
  }
}

std::string Session::write_checkpoint(int64_t step) {
  const fs::path dir = env_.checkpoint_dir();
  const std::string name = checkpoint_step_name(step);
  const fs::path final_path = dir / name;
  const int rank = env_.run_info.rank;
  const fs::path tmp =
      dir / (name + ".tmp-" + (env_.pg ? std::string("ranks") : std::to_string(::getpid())));
  if (rank == 0) {
    fs::create_directories(dir);
    // A [save] dir two runs share: neither may replace or rotate away the other's.
    if (const std::string owner = checkpoint_manifest_run(dir / "manifest.json");
        !owner.empty() && owner != env_.run_dir_abs)
      throw std::runtime_error(dir.string() + " holds the checkpoints of the run in " + owner +
                               ", not this one (" + env_.run_dir_abs +
                               "): give this run a [save] dir of its own");
    std::error_code ec;
    if (fs::exists(fs::symlink_status(tmp, ec))) {
      if (!is_checkpoint_leftover(tmp))
        throw std::runtime_error(tmp.string() +
                                 " is in the way and tightfit did not make it: move it away");
      remove_tree(tmp.string());
    }
    fs::create_directory(tmp);
    create_empty_file((tmp / kCheckpointMarker).string());
  }
  if (env_.pg) env_.pg->barrier();

  // Plugin state goes to its file as each plugin puts it (state larger than
  // memory, an optimizer's disk tier, streams through); so do the weights.
  auto save_plugin = [&](SafetensorsWriter& state, PluginInstance& inst, const std::string& prefix,
                         auto save_fn) {
    if (!save_fn) return;
    inst.ctx->state_out = &state;
    inst.ctx->state_prefix = prefix;
    const NullOnExit<SafetensorsWriter> done{inst.ctx->state_out};
    const tf_status st =
        plugin_call(inst, "save_state", [&] { return save_fn(inst.state, inst.ctx.get()); });
    check_plugin_status(st, inst, "save_state");
  };
  auto save_plugins = [&](SafetensorsWriter& state) {
    for (size_t i = 0; i < plugins_.strategies.size(); ++i)
      save_plugin(state, plugins_.strategies[i],
                  "strategy." + std::to_string(i) + "." + plugins_.strategies[i].plugin->name + ".",
                  plugins_.strategies[i].plugin->strategy()->save_state);
    save_plugin(state, plugins_.schedule, "schedule." + plugins_.schedule.plugin->name + ".",
                plugins_.schedule.plugin->schedule()->save_state);
  };
  if (rank != 0) {
    SafetensorsWriter state(
        (tmp / ("state.rank-" + std::to_string(rank) + ".safetensors")).string());
    save_plugins(state);
    state.finish();
    env_.pg->barrier();  // this rank's file is complete
    env_.pg->barrier();  // rank 0 moved the folder into place and listed it in the manifest
    return (dir / name).string();
  }

  {
    // Trained parameters kept in another tier are saved from it, one at a
    // time; frozen ones there are saved as their placeholders (they are
    // recreated from the recipe's init or weights). Parameters split across
    // ranks are saved by the strategy that split them, part by part; here
    // they are placeholders.
    uint64_t header_space = 4096;
    for (const Param& p : store_.all()) header_space += p.name.size() + 96 + 24 * p.shape.size();
    SafetensorsWriter model((tmp / "model.safetensors").string(),
                            {{"format", "tightfit"}, {"model_plugin", plugins_.model.plugin->name}},
                            header_space);
    for (Param& p : store_.all()) {
      if (p.residency == TF_TIER_SHARDED)
        model.put(p.name, at::empty({0}, at::TensorOptions().dtype(p.value.scalar_type())));
      else if (p.kept_by_host && !p.value.defined())  // not taken yet: none to carry
        model.put(p.name, at::empty({0}, at::TensorOptions().dtype(p.dtype)));
      else if (p.trainable && p.residency != TF_TIER_DEVICE)
        executor_.with_resident(p, [&] { model.put(p.name, p.value); });
      else
        model.put(p.name, p.value);
    }
    model.finish();
  }

  write_safetensors((tmp / "optimizer.safetensors").string(), update_.optimizer().state(),
                    {{"optimizer", update_.optimizer().config().name}});

  {
    SafetensorsWriter state((tmp / "state.safetensors").string());
    // The generators dropout draws from: the CPU's, and the run's CUDA
    // device's when it trains there.
    for (const auto& [key, dev] : rng_devices()) {
      at::Generator gen = at::globalContext().defaultGenerator(dev);
      std::lock_guard<std::mutex> lock(gen.mutex());
      state.put(key, gen.get_state());
    }
    save_plugins(state);
    state.finish();
  }
  if (env_.pg) env_.pg->barrier();  // the other ranks' state files are complete

  nlohmann::json trainer = {{"format", kCheckpointFormatVersion},
                            {"step", step},
                            {"optimizer_steps", update_.optimizer().steps()},
                            {"optimizer_steps_sat_out", update_.steps_sat_out()},
                            {"lr", update_.optimizer().lr()},
                            {"data_position", data_.batcher().position()},
                            {"world_size", env_.run_info.world_size},
                            {"model_plugin", plugins_.model.plugin->name},
                            {"abi", abi_version_string(TF_ABI_VERSION)},
                            {"recipe", recipe_.source()}};
  write_file_synced((tmp / "trainer.json").string(), dump_json(trainer, 2));
  fsync_path(tmp.string());

  // Move into place; an older copy of the same step is replaced only after
  // the new one is complete.
  if (fs::exists(final_path)) {
    const fs::path old = dir / (name + ".old");
    std::error_code ec;
    if (fs::exists(fs::symlink_status(old, ec)) && !is_checkpoint_leftover(old))
      throw std::runtime_error(old.string() +
                               " is in the way and tightfit did not make it: move it away");
    remove_tree(old.string());
    fs::rename(final_path, old);
    fs::rename(tmp, final_path);
    remove_tree(old.string());
  } else {
    fs::rename(tmp, final_path);
  }
  fsync_path(dir.string());

  std::vector<std::string> names = read_checkpoint_manifest(dir / "manifest.json");
  names.erase(std::remove(names.begin(), names.end(), name), names.end());
  names.push_back(name);
  const auto keep = static_cast<size_t>(env_.config.save.keep_last);
  std::vector<std::string> rotated;
  while (names.size() > keep) {
    rotated.push_back(names.front());
    names.erase(names.begin());
  }
  write_checkpoint_manifest(dir, names, env_.run_dir_abs);
  for (const auto& r : rotated) remove_tree((dir / r).string());
  // Folders of saves a crash cut short (never listed, never loaded): this run
  // owns the folder, so whatever temporary is left is from an earlier process.
  if (rank == 0) {
    std::error_code ec;
    std::vector<fs::path> leftovers;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (is_checkpoint_leftover(e.path())) leftovers.push_back(e.path());
    }
    for (const auto& l : leftovers) try {
        remove_tree(l.string());
      } catch (const std::exception& e) {
        log(TF_LOG_WARN, std::string("cannot remove the leftover ") + l.string() + ": " + e.what());
      }
  }
  if (env_.pg) env_.pg->barrier();
  log(TF_LOG_INFO, "saved checkpoint " + final_path.string());
  return final_path.string();
}

std::string Session::non_finite_training_state() {
  std::string bad;
  at::NoGradGuard no_grad;
  for (Param& p : store_.all()) {
    // Trained parameters: frozen ones are the recipe's weights as they came.
    if (!p.trainable || p.residency == TF_TIER_SHARDED || !p.value.defined() ||
        !p.value.is_floating_point())
      continue;
    auto finite = [&] { return p.value.numel() == 0 || p.value.isfinite().all().item<bool>(); };
    bool ok = true;
    if (p.residency != TF_TIER_DEVICE)
      executor_.with_resident(p, [&] { ok = finite(); });
    else
      ok = finite();
    if (!ok) {
      bad = "parameter \"" + p.name + "\"";
      break;
    }
  }
  if (bad.empty())
    if (const std::string s = first_non_finite(update_.optimizer().state()); !s.empty())
      bad = "optimizer state \"" + s + "\"";
  // Every rank saves or none does: the ranks agree on the verdict.
  if (env_.pg) {
    at::Tensor flag = at::full({1}, bad.empty() ? 0.0f : 1.0f, at::kFloat).to(env_.device);
    env_.pg->all_reduce(flag, ReduceOp::Max);
    if (bad.empty() && flag.item<float>() > 0) bad = "another rank's state";
  }
  return bad;
}

bool Session::load_latest_checkpoint() {
  const fs::path dir = env_.checkpoint_dir();
  std::vector<std::string> names = read_checkpoint_manifest(dir / "manifest.json");
  std::string errors;
  for (auto it = names.rbegin(); it != names.rend(); ++it) {
    const fs::path cp = dir / *it;
    try {
      const TrainerRecord trainer = parse_trainer_record(
          read_file_text((cp / "trainer.json").string()), (cp / "trainer.json").string());
      for (const auto& [name, count] : trainer.steps_sat_out)
        if (store_.find(name) == nullptr)
          throw std::runtime_error((cp / "trainer.json").string() +
                                   " counts the optimizer steps that \"" + name +
                                   "\" sat out, and this model has no such parameter: resume "
                                   "with the recipe that saved it");
      // Validate everything before changing any state. The weights and the
      // plugins' state are read a tensor at a time (a model or optimizer tier
      // larger than memory), the weights twice: once to check, once to load.
      const std::string model_path = (cp / "model.safetensors").string();
      const SafetensorsReader model(model_path);
      // Read in its own category: on the CPU the loaded tensors are the state.
      SafetensorsFile opt = [&] {
        CategoryScope scope(TF_MEM_OPTIMIZER);
        return read_safetensors((cp / "optimizer.safetensors").string());
      }();
      SafetensorsSet state;
      state.add((cp / "state.safetensors").string());
      validate_optimizer_state(opt.tensors, store_, update_.optimizer().slot_names(),
                               (cp / "optimizer.safetensors").string());
      for (const std::string& name : model.names())
        if (const std::string bad = first_non_finite({{name, model.read(name)}}); !bad.empty())
          throw std::runtime_error(model_path + ": \"" + bad + "\" holds a NaN or an infinity");
      // Sharded plugin state from every rank of the run that saved it (any
      // number of ranks may load it: plugins re-slice by the saved world size).
      for (int64_t r = 1; r < trainer.world_size; ++r) {
        const fs::path f = cp / ("state.rank-" + std::to_string(r) + ".safetensors");
        if (!fs::exists(f))
          throw std::runtime_error(f.string() + " is missing: the checkpoint was saved by " +
                                   std::to_string(trainer.world_size) +
                                   " ranks and needs every rank's state file");
        state.add(f.string());
      }
      // Frozen parameters kept in a host or disk tier are recreated from the
      // recipe's init or weights, not loaded (the checkpoint may hold their
      // dense values or their placeholders); their declared shape still has
      // to match.
      auto frozen_away = [](const Param& p) {
        return !p.trainable && !p.kept_by_host &&
               (p.residency == TF_TIER_HOST || p.residency == TF_TIER_DISK);
      };
      // The copies the kernel keeps, as the checkpoint holds them: their
      // values, nothing (saved before any pass took them), or missing (saved
      // by a tightfit before 1.24, whose schedule kept them in its state:
      // its load_state hands them over, or the checkpoint is refused below).
      std::vector<std::string> kept_missing;
      for (const Param& p : store_.all()) {
        if (p.kept_by_host) {
          if (!model.contains(p.name)) {
            kept_missing.push_back(p.name);
            continue;
          }
          const int64_t n = c10::multiply_integers(model.shape(p.name));
          if (n > 0 && at::IntArrayRef(model.shape(p.name)) != at::IntArrayRef(p.shape))
            throw std::runtime_error("the copy \"" + p.name + "\" has shape " +
                                     c10::str(at::IntArrayRef(model.shape(p.name))) +
                                     " in the checkpoint but " +
                                     c10::str(at::IntArrayRef(p.shape)) + " in this recipe");
          continue;
        }
        if (!model.contains(p.name))
          throw std::runtime_error("model.safetensors has no parameter \"" + p.name +
                                   "\" (was it saved from another model or preset?)");
        const at::IntArrayRef saved(model.shape(p.name));
        if (frozen_away(p)) {
          const int64_t n = c10::multiply_integers(saved);
          if (n > 0 && n != p.numel())
            throw std::runtime_error("parameter \"" + p.name + "\" has " + std::to_string(n) +
                                     " values in the checkpoint but " + std::to_string(p.numel()) +
                                     " in this recipe");
          continue;
        }
        if (p.residency != TF_TIER_SHARDED && saved != p.value.sizes())
          throw std::runtime_error("parameter \"" + p.name + "\" has shape " + c10::str(saved) +
                                   " in the checkpoint but " + c10::str(p.value.sizes()) +
                                   " in this recipe");
      }
      {
        at::NoGradGuard no_grad;
        for (Param& p : store_.all()) {
          if (p.residency == TF_TIER_SHARDED) continue;  // its strategy's load_state
          if (frozen_away(p)) continue;
          if (p.kept_by_host) {
            const CategoryScope scope(TF_MEM_WEIGHTS);
            const bool taken =
                model.contains(p.name) && c10::multiply_integers(model.shape(p.name)) > 0;
            p.value =
                taken ? ParamStore::kept_copy_of(p, model.read(p.name), store_.get(p.copy_of).value)
                      : at::Tensor();
            continue;
          }
          if (p.trainable && p.residency != TF_TIER_DEVICE)
            executor_.with_resident(p, [&] { p.value.copy_(model.read(p.name)); });
          else
            p.value.copy_(model.read(p.name));
        }
        CategoryScope scope(TF_MEM_OPTIMIZER);
        update_.optimizer().state().clear();
        for (auto& [k, t] : opt.tensors) update_.optimizer().state()[k] = t.to(env_.device);
      }
      update_.optimizer().set_steps(trainer.optimizer_steps);
      update_.set_steps_sat_out(trainer.steps_sat_out);
      update_.optimizer().set_lr(trainer.lr);
      if (data_.has_batches()) data_.batcher().set_position(trainer.data_position);
      for (const auto& [key, dev] : rng_devices())
        if (state.contains(key)) {
          at::Generator gen = at::globalContext().defaultGenerator(dev);
          std::lock_guard<std::mutex> lock(gen.mutex());
          gen.set_state(state.read(key));
        }
      auto load_plugin = [&](PluginInstance& inst, const std::string& prefix, auto load_fn) {
        if (!load_fn) return;
        inst.ctx->state_in = &state;
        inst.ctx->state_prefix = prefix;
        const NullOnExit<const SafetensorsSet> done{inst.ctx->state_in};
        const tf_status st =
            plugin_call(inst, "load_state", [&] { return load_fn(inst.state, inst.ctx.get()); });
        check_plugin_status(st, inst, "load_state");
      };
      for (size_t i = 0; i < plugins_.strategies.size(); ++i)
        load_plugin(
            plugins_.strategies[i],
            "strategy." + std::to_string(i) + "." + plugins_.strategies[i].plugin->name + ".",
            plugins_.strategies[i].plugin->strategy()->load_state);
      load_plugin(plugins_.schedule, "schedule." + plugins_.schedule.plugin->name + ".",
                  plugins_.schedule.plugin->schedule()->load_state);
      for (const std::string& name : kept_missing)
        if (!store_.get(name).value.defined())
          throw std::runtime_error("model.safetensors has no copy \"" + name +
                                   "\" (the reference the run trains against), and the "
                                   "schedule's state did not bring it: resume with the recipe "
                                   "and tightfit that saved it");
      step_ = trainer.step;
      note_input_folder(this, cp.string(), "the checkpoint");  // no export replaces what it loaded
      log(TF_LOG_INFO, "resumed from " + cp.string() + " at step " + std::to_string(step_));
      return true;
    } catch (const std::exception& e) {
      const std::string msg = c10::str("checkpoint ", cp.string(), " cannot be used: ", e.what());
      log(TF_LOG_WARN, msg + "; trying the one before it");
      errors += "\n  " + msg;
    }
  }
  if (!errors.empty())
    throw std::runtime_error(
        "no usable checkpoint in " + dir.string() + ":" + errors +
        "\nThe files are left as they are; fix or move them, or start without --resume");
  return false;
}

}  // namespace tightfit
