#include "fit_search.hpp"

#include <algorithm>
#include <cmath>

namespace tightfit::host {

namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

template <class T>
int index_of(const std::vector<T>& v, const T& x) {
  return static_cast<int>(std::find(v.begin(), v.end(), x) - v.begin());
}

// The user's keys of a replaced table (LoRA targets, quantize block size).
toml::table user_keys(const Recipe& base, const std::string& plugin) {
  const toml::table* t = base.strategy_table(plugin);
  return t ? *t : toml::table{};
}

}  // namespace

std::string FitChoice::describe() const {
  std::vector<std::string> parts;
  if (lora_rank > 0) parts.push_back("lora r" + std::to_string(lora_rank));
  if (lora_rank < 0) parts.push_back("lora (recipe's)");
  if (weights != "dense") parts.push_back(weights + " base");
  if (precision != "none") parts.push_back(precision == "bf16" ? "bf16 weights" : "autocast");
  if (optimizer == "int8") parts.push_back("8-bit adam");
  if (optimizer == "host" || optimizer == "disk") parts.push_back("optimizer@" + optimizer);
  if (checkpoint_every > 0) parts.push_back("checkpoint " + std::to_string(checkpoint_every));
  if (params_tier != "none")
    parts.push_back("weights@" + params_tier + " prefetch " + std::to_string(prefetch));
  if (activations_tier != "none") parts.push_back("activations@" + activations_tier);
  if (fused) parts.push_back("fused update");
  if (micro > 1) parts.push_back("micro x" + std::to_string(micro));
  if (zero_stage > 0) parts.push_back("zero " + std::to_string(zero_stage));
  if (parts.empty()) return "plain";
  std::string out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) out += " + " + parts[i];
  return out;
}

std::vector<std::string> FitChoice::approximations() const {
  std::vector<std::string> out;
  if (lora_rank != 0) out.push_back("LoRA");
  if (weights != "dense") out.push_back(weights + " weights");
  if (precision == "autocast") out.push_back("bf16 compute");
  if (precision == "bf16") out.push_back("bf16 weights");
  if (optimizer == "int8") out.push_back("8-bit state");
  if (fused) out.push_back("clip by last norm");
  return out;
}

double FitChoice::quality_penalty() const {
  // Ordered by how far each moves from the plain run's maths: training a
  // low-rank update instead of the weights first (higher rank closer),
  // then 4-bit and 8-bit bases, bf16 weights (small updates round away),
  // 8-bit moments, bf16 compute, clipping by the previous norm.
  double p = 0;
  if (lora_rank > 0) p += 3 - std::log2(static_cast<double>(lora_rank)) / 10;
  if (weights == "nf4") p += 1;
  if (weights == "int8") p += 0.5;
  if (precision == "bf16") p += 1;
  if (precision == "autocast") p += 0.3;
  if (optimizer == "int8") p += 0.3;
  if (fused) p += 0.1;
  return p;
}

bool FitChoice::saves_no_more_than(const FitChoice& other) const {
  // bf16 compute is not a saving everywhere: its casts of the weights can
  // outweigh the halved activations (short sequences, checkpointed blocks),
  // so a stack with it that does not fit says nothing of the same stack in
  // fp32.
  if (precision == "none" && other.precision == "autocast") return false;
  for (int k = 0; k < kKnobCount; ++k)
    if (saving[static_cast<size_t>(k)] > other.saving[static_cast<size_t>(k)]) return false;
  return true;
}

int FitChoice::strategies() const {
  return (weights != "dense") + (optimizer == "int8") + (precision != "none") +
         (checkpoint_every > 0) +
         (optimizer == "host" || optimizer == "disk" || params_tier != "none" ||
          activations_tier != "none") +
         fused + (micro > 1);
}

FitChoice FitChoice::plain() const {
  FitChoice c;
  c.lora_rank = lora_rank;
  c.zero_stage = zero_stage < 0 ? -1 : 0;  // data parallel: what ranks do without ZeRO
  c.saving[kTrain] = saving[kTrain];
  return c;
}

FitSpace fit_space(const Recipe& base, const PluginRegistry& registry,
                   const std::vector<std::string>& keep, const std::vector<std::string>& without,
                   const std::vector<std::string>& change, std::vector<int> lora_ranks,
                   bool adapters_instead, int ranks) {
  FitSpace sp;
  auto installed = [&](const std::string& name) { return registry.find_any(name) != nullptr; };
  for (const char* name : {"lora", "quantize", "adamw8", "precision", "checkpoint", "offload",
                           "fused_update", "accumulate", "shard"})
    if (installed(name) && !has(keep, name) && !has(without, name)) sp.searched.push_back(name);
  auto searched = [&](const char* name) { return has(sp.searched, name); };
  const toml::table* run = base.table("run");
  const std::string device = run ? (*run)["device"].value_or(std::string("cpu")) : "cpu";
  const bool cuda = device.rfind("cuda", 0) == 0;
  const toml::table* data = base.table("data");
  sp.batch_size = data ? (*data)["batch_size"].value_or(int64_t{1}) : 1;

  const toml::table* lora = base.strategy_table("lora");
  if (lora && has(keep, "lora")) {
    sp.allow_full = false;
    sp.notes.push_back("LoRA as the recipe sets it (--keep lora)");
  } else if (searched("lora") && (lora || adapters_instead)) {
    sp.allow_full = false;
    // The recipe's rank is its choice: other ranks only when asked for
    // (--lora-ranks); a recipe without LoRA that turns to it tries 8, 16, 64.
    if (lora) {
      const int own = static_cast<int>((*lora)["rank"].value_or(int64_t{8}));
      if (lora_ranks.empty())
        sp.notes.push_back("LoRA rank " + std::to_string(own) +
                           " as the recipe sets it (--lora-ranks to try others)");
      lora_ranks.push_back(own);
    } else if (lora_ranks.empty()) {
      lora_ranks = {8, 16, 64};
    }
    std::sort(lora_ranks.rbegin(), lora_ranks.rend());  // a larger rank saves less
    lora_ranks.erase(std::unique(lora_ranks.begin(), lora_ranks.end()), lora_ranks.end());
    sp.lora_ranks = lora_ranks;
    if (!lora)
      sp.notes.push_back("no stack that trains all weights fits: LoRA adapters train instead");
  }
  sp.weights = {"dense"};
  if (searched("quantize")) {
    // A recipe that quantizes its base keeps its format (a different base
    // is a different model to train), unless --change quantize.
    const toml::table* quantize = base.strategy_table("quantize");
    if (quantize && (*quantize)["weights"].value_or(true) && !has(change, "quantize")) {
      const std::string format = (*quantize)["format"].value_or(std::string("nf4"));
      sp.weights = {format};
      sp.notes.push_back("the base stays " + format +
                         " as the recipe quantizes it (--change quantize to try others)");
    } else {
      sp.weights = {"dense", "int8", "nf4"};
    }
  }
  sp.precision = {"none"};
  if (searched("precision")) sp.precision = {"none", "autocast", "bf16"};
  sp.optimizer = {"fp32"};
  if (searched("adamw8")) sp.optimizer.push_back("int8");  // 8-bit AdamW, its own strategy
  if (searched("offload")) {
    // On a CPU run the host tier is the same RAM: it saves nothing there.
    if (cuda) sp.optimizer.push_back("host");
    sp.optimizer.push_back("disk");
  }
  sp.checkpoint_every = {0};
  if (searched("checkpoint")) sp.checkpoint_every = {0, 2, 1};
  sp.params_tier = {"none"};
  sp.prefetch = {0};
  if (searched("offload")) {
    if (cuda) sp.params_tier.push_back("host");
    sp.params_tier.push_back("disk");
    sp.prefetch = {2, 1};  // more read ahead holds more
  }
  sp.activations_tier = {"none"};
  if (searched("offload") && searched("checkpoint")) {
    if (cuda) sp.activations_tier.push_back("host");
    sp.activations_tier.push_back("disk");
  }
  sp.fused = searched("fused_update");
  sp.zero = {-1};
  // ZeRO stages are a knob only with ranks; layer sharding (one process,
  // several devices) stays as the recipe has it.
  const toml::table* shard = base.strategy_table("shard");
  const bool layers = shard && (*shard)["mode"].value_or(std::string("data")) == "layers";
  if (searched("shard") && ranks > 1 && !layers) {
    sp.zero = {0, 1, 2, 3};
  } else if (searched("shard")) {
    sp.searched.erase(std::find(sp.searched.begin(), sp.searched.end(), "shard"));
    if (layers) sp.notes.push_back("shard mode = \"layers\" kept as the recipe sets it");
  }
  sp.micro = {1};
  const toml::table* sched = base.table("schedule");
  const std::string schedule = sched ? (*sched)["plugin"].value_or(std::string()) : "standard";
  if (searched("accumulate")) {
    if (schedule == "standard") {
      for (int m : {2, 4, 8})
        if (sp.batch_size % m == 0) sp.micro.push_back(m);
    } else {
      sp.notes.push_back("micro-batches not searched: the recipe's schedule is " + schedule);
    }
  }
  return sp;
}

std::vector<FitChoice> enumerate_choices(const FitSpace& sp) {
  std::vector<int> trains;
  if (sp.allow_full) trains.push_back(0);
  if (!sp.allow_full && sp.lora_ranks.empty()) trains.push_back(-1);  // the recipe's LoRA
  for (int r : sp.lora_ranks) trains.push_back(r);
  std::vector<FitChoice> out;
  for (size_t ti = 0; ti < trains.size(); ++ti)
    for (const auto& w : sp.weights)
      for (const auto& pr : sp.precision)
        for (const auto& opt : sp.optimizer)
          for (int ck : sp.checkpoint_every)
            for (const auto& tier : sp.params_tier)
              for (int pf : tier == "none" ? std::vector<int>{0} : sp.prefetch)
                for (const auto& act : sp.activations_tier)
                  for (int fused = 0; fused <= (sp.fused ? 1 : 0); ++fused)
                    for (int m : sp.micro)
                      for (int z : sp.zero) {
                        // Only checkpointed stages keep an input to move.
                        if (act != "none" && ck == 0) continue;
                        const bool frozen_base = trains[ti] != 0;
                        // A full fine-tune stores its weights dense; it may put
                        // them on a tier only with the optimizer state there too
                        // (the update runs where the state is).
                        if (!frozen_base && w != "dense") continue;
                        if (!frozen_base && tier != "none" && opt != "host" && opt != "disk")
                          continue;
                        // bf16 weights are converted on the device only.
                        if (pr == "bf16" && w == "dense" && tier != "none") continue;
                        if (fused && m > 1) continue;  // the update happens once per batch
                        if (fused && (opt == "host" || opt == "disk")) continue;  // updated there
                        FitChoice c;
                        c.lora_rank = trains[ti];
                        c.weights = w;
                        c.precision = pr;
                        c.optimizer = opt;
                        c.checkpoint_every = ck;
                        c.params_tier = tier;
                        c.prefetch = pf;
                        c.activations_tier = act;
                        c.fused = fused != 0;
                        c.micro = m;
                        c.zero_stage = z;
                        c.saving = {static_cast<int>(ti),
                                    index_of(sp.weights, w),
                                    index_of(sp.precision, pr),
                                    index_of(sp.optimizer, opt),
                                    index_of(sp.checkpoint_every, ck),
                                    tier == "none" ? 0
                                                   : index_of(sp.params_tier, tier) +
                                                         index_of(sp.prefetch, pf),
                                    index_of(sp.activations_tier, act),
                                    fused,
                                    index_of(sp.micro, m),
                                    index_of(sp.zero, z)};
                        out.push_back(c);
                      }
  std::stable_sort(out.begin(), out.end(), [](const FitChoice& a, const FitChoice& b) {
    int sa = 0, sb = 0;
    for (int k = 0; k < kKnobCount; ++k) {
      sa += a.saving[static_cast<size_t>(k)];
      sb += b.saving[static_cast<size_t>(k)];
    }
    return sa > sb;
  });
  return out;
}

Recipe apply_choice(const Recipe& base, const FitSpace& sp, const FitChoice& c) {
  Recipe r = base;
  r.remove_strategies(sp.searched);
  auto searched = [&](const char* name) { return has(sp.searched, name); };
  if (c.lora_rank > 0 && searched("lora")) {
    toml::table t = user_keys(base, "lora");
    const bool own_alpha = t.contains("alpha");
    t.insert_or_assign("rank", int64_t{c.lora_rank});
    if (!own_alpha) t.insert_or_assign("alpha", 2.0 * c.lora_rank);
    r.add_strategy("lora", t);
  }
  if (searched("quantize") && c.weights != "dense") {
    toml::table t = user_keys(base, "quantize");
    // The plugin's defaults (weights = true, optimizer_state = "fp32": 8-bit
    // state is adamw8's knob) are written only over a value that differs.
    if (t.contains("weights")) t.insert_or_assign("weights", true);
    if (t.contains("optimizer_state")) t.insert_or_assign("optimizer_state", std::string("fp32"));
    t.insert_or_assign("format", c.weights);
    r.add_strategy("quantize", t);
  }
  if (searched("adamw8") && c.optimizer == "int8")
    r.add_strategy("adamw8", user_keys(base, "adamw8"));
  if (searched("precision") && c.precision != "none") {
    toml::table t = user_keys(base, "precision");
    t.insert_or_assign("mode", c.precision);
    r.add_strategy("precision", t);
  }
  if (searched("checkpoint") && c.checkpoint_every > 0)
    r.add_strategy("checkpoint", toml::table{{"every", int64_t{c.checkpoint_every}}});
  const bool opt_tier = c.optimizer == "host" || c.optimizer == "disk";
  if (searched("offload") &&
      (opt_tier || c.params_tier != "none" || c.activations_tier != "none")) {
    toml::table t = user_keys(base, "offload");
    t.insert_or_assign("params", c.params_tier);
    t.insert_or_assign("optimizer", std::string(opt_tier ? c.optimizer : "none"));
    t.insert_or_assign("activations", c.activations_tier);
    if (c.params_tier != "none") t.insert_or_assign("prefetch", int64_t{c.prefetch});
    if (c.params_tier != "none" && c.lora_rank == 0) t.insert_or_assign("trainable", true);
    r.add_strategy("offload", t);
  }
  if (searched("fused_update") && c.fused)
    r.add_strategy("fused_update", user_keys(base, "fused_update"));
  if (searched("shard") && c.zero_stage >= 0) {
    toml::table t = user_keys(base, "shard");
    t.insert_or_assign("mode", std::string(c.zero_stage == 0 ? "data" : "zero"));
    if (c.zero_stage > 0) t.insert_or_assign("stage", int64_t{c.zero_stage});
    r.add_strategy("shard", t);
  }
  if (c.micro > 1) {
    r.apply_override("schedule.plugin=\"accumulate\"");
    r.apply_override("schedule.micro_batches=" + std::to_string(c.micro));
    r.apply_override("data.batch_size=" + std::to_string(sp.batch_size / c.micro));
  }
  return r;
}

}  // namespace tightfit::host
