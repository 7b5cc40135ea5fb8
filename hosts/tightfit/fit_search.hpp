// The stacks `tightfit fit` searches: one choice per knob (what trains, how
// frozen weights are stored, precision, where the optimizer state lives,
// checkpointing, where frozen weights and checkpointed inputs live, the fused
// update, micro-batches),
// each knob's options listed from the least to the most memory-saving, and
// the recipe a choice makes from the user's.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "plugin_loader.hpp"
#include "recipe.hpp"

namespace tightfit::host {

enum FitKnob : int {
  kTrain,        // all weights, or LoRA at a rank
  kWeights,      // frozen weights dense, int8 or NF4 (quantize)
  kPrecision,    // fp32, bf16 autocast, bf16 weights (precision)
  kOptimizer,    // AdamW state fp32, int8 (quantize), host or disk (offload)
  kCheckpoint,   // none, every 2nd block, every block
  kParams,       // frozen block weights on the device, host or disk (offload)
  kActivations,  // with checkpointing: recomputed stages' inputs on the device, host or disk
  kFused,        // the update in backward (fused_update)
  kMicro,        // micro-batches per update (accumulate), same effective batch
  kZero,         // with ranks > 1: data parallel, ZeRO stage 1, 2 or 3 (shard)
  kKnobCount
};

struct FitChoice {
  int lora_rank = 0;  // 0: all weights train
  std::string weights = "dense";
  std::string precision = "none";
  std::string optimizer = "fp32";
  int checkpoint_every = 0;
  std::string params_tier = "none";
  int prefetch = 0;
  std::string activations_tier = "none";
  bool fused = false;
  int micro = 1;
  int zero_stage = -1;  // -1: one rank (no shard table); 0: data parallel; 1-3: ZeRO stage
  // Per knob, the option's place in that knob's memory-saving order.
  std::array<int, kKnobCount> saving{};

  // "lora r16 + nf4 + checkpoint 1 + ...", or "plain".
  std::string describe() const;
  // The number of strategies it adds (fewer is simpler, at equal time).
  int strategies() const;
  // The same training target with no memory strategy (the slowdown's base).
  FitChoice plain() const;
  // What the stack changes in the maths (empty: exact).
  std::vector<std::string> approximations() const;
  // For --objective quality: 0 exact, larger further from the plain maths.
  double quality_penalty() const;
  // Whether `other` saves at least as much on every knob (so if `other`
  // does not fit, this one does not either).
  bool saves_no_more_than(const FitChoice& other) const;
};

struct FitSpace {
  std::vector<std::string> searched;  // plugins fit manages (their tables are replaced)
  std::vector<int> lora_ranks;        // beside 0 (all weights) when lora is searched
  bool allow_full = true;             // all weights may train
  std::vector<std::string> weights, precision, optimizer, params_tier, activations_tier;
  std::vector<int> checkpoint_every, micro;
  bool fused = false;
  std::vector<int> prefetch;       // for the params tier
  std::vector<int> zero;           // {-1} with one rank; else data parallel (0) and ZeRO stages
  int64_t batch_size = 1;          // the recipe's (the effective batch with micro-batches)
  std::vector<std::string> notes;  // why a knob is fixed
};

// The search space for `base` given the installed plugins, the device, and
// the user's --keep / --without / --change lists. The recipe's choices stay:
// what trains (all weights, or LoRA adapters at the recipe's rank, and at
// `lora_ranks` only when the user gave them) and the format of a quantized
// base (others only with "quantize" in `change`); `adapters_instead`
// searches LoRA (`lora_ranks`, else 8, 16, 64) for a recipe that trains all
// weights, when no stack that does fits.
FitSpace fit_space(const Recipe& base, const PluginRegistry& registry,
                   const std::vector<std::string>& keep, const std::vector<std::string>& without,
                   const std::vector<std::string>& change, std::vector<int> lora_ranks,
                   bool adapters_instead, int ranks);

// Every consistent choice (NF4/int8 only for frozen weights, fused update
// only with one micro-batch, ...), the most memory-saving first.
std::vector<FitChoice> enumerate_choices(const FitSpace& space);

// `base` with the searched plugins' tables replaced by the choice's (keys
// the user set in a replaced table, such as LoRA targets, are kept).
Recipe apply_choice(const Recipe& base, const FitSpace& space, const FitChoice& choice);

}  // namespace tightfit::host
