// selective_checkpoint: activation checkpointing of chosen blocks only — the
// ones named in `blocks`, or the fewest that bring the activations the blocks
// keep for backward under `activation_budget`. Built out of tree against the
// installed tightfit SDK (find_package(tightfit), tightfit_add_plugin).
//
// The built-in `checkpoint` strategy recomputes every N-th block, so its
// memory steps are coarse (all, half, a third ...); this policy spends
// recompute only where the budget needs it. Recomputation is exact: the
// gradients are the plain run's.
#include <algorithm>
#include <bit>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "tightfit/plugin_sdk.hpp"

namespace {

struct SelectiveCheckpoint {
  tf_sdk::Host host;
  std::vector<int64_t> blocks;  // as the recipe gives them (negative: from the end)
  int64_t activation_budget = 0;
};

// A declared block: its stage index and the activation bytes it keeps per
// token when not checkpointed.
struct Block {
  int32_t stage;
  int64_t bytes_per_token;
};

std::vector<Block> running_blocks(const tf_sdk::Host& host) {
  std::vector<Block> out;
  for (int32_t i = 0, n = host.stage_count(); i < n; ++i) {
    const tf_stage_info info = host.stage_info(i);
    // A block skipped by another strategy keeps nothing to save.
    if (info.kind == TF_STAGE_BLOCK && !info.skip)
      out.push_back({i, info.activation_bytes_per_token});
  }
  return out;
}

// The blocks the recipe names, as indices into `blocks`.
std::vector<size_t> named_blocks(const SelectiveCheckpoint& s, size_t n_blocks) {
  std::vector<size_t> chosen;
  for (int64_t b : s.blocks) {
    const int64_t index = b < 0 ? static_cast<int64_t>(n_blocks) + b : b;
    if (index < 0 || index >= static_cast<int64_t>(n_blocks))
      throw std::invalid_argument("selective_checkpoint: blocks has " + std::to_string(b) +
                                  " but the model runs " + std::to_string(n_blocks) +
                                  " blocks (0.." + std::to_string(n_blocks - 1) +
                                  ", or -1 for the last)");
    chosen.push_back(static_cast<size_t>(index));
  }
  std::sort(chosen.begin(), chosen.end());
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  return chosen;
}

// The fewest blocks whose checkpointing brings the kept activations under
// the budget: the largest first; among equals, spread evenly over the depth.
// A checkpointed block keeps only its input, taken as 1/16 of what it would
// keep (the planner's own default when a model does not declare it).
std::vector<size_t> budgeted_blocks(const SelectiveCheckpoint& s, const std::vector<Block>& blocks,
                                    int64_t tokens) {
  int64_t kept = 0;
  for (const Block& b : blocks) kept += b.bytes_per_token * tokens;
  std::vector<size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), 0);
  // Evenly spread: bit-reversal-like order by stride halving (0, n/2, n/4, 3n/4, ...).
  std::vector<size_t> spread;
  for (size_t stride = std::max<size_t>(1, std::bit_floor(blocks.size())); stride >= 1;
       stride /= 2) {
    for (size_t i = 0; i < blocks.size(); i += stride)
      if (std::find(spread.begin(), spread.end(), i) == spread.end()) spread.push_back(i);
    if (stride == 1) break;
  }
  std::stable_sort(spread.begin(), spread.end(), [&](size_t a, size_t b) {
    return blocks[a].bytes_per_token > blocks[b].bytes_per_token;
  });
  std::vector<size_t> chosen;
  for (size_t i : spread) {
    if (kept <= s.activation_budget) break;
    const int64_t full = blocks[i].bytes_per_token * tokens;
    kept -= full - full / 16;
    chosen.push_back(i);
  }
  if (kept > s.activation_budget)
    s.host.log(TF_LOG_WARN,
               "selective_checkpoint: even with every block checkpointed the blocks "
               "keep about " +
                   std::to_string(kept >> 20) + " MiB, over activation_budget (" +
                   std::to_string(s.activation_budget >> 20) +
                   " MiB); lower the batch size or the sequence length");
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    auto s = std::make_unique<SelectiveCheckpoint>(SelectiveCheckpoint{tf_sdk::Host(api, ctx)});
    s->blocks = s->host.get_int_list("blocks");
    s->activation_budget = s->host.get_int("activation_budget");
    if (s->blocks.empty() == (s->activation_budget <= 0))
      throw std::invalid_argument(
          "selective_checkpoint: set exactly one of blocks = [...] (which blocks to recompute) "
          "and activation_budget = \"SIZE\" (the fewest blocks that fit it)");
    *out = s.release();
    return TF_OK;
  });
}

tf_status configure(void* state, tf_host_context* ctx) {
  auto* s = static_cast<SelectiveCheckpoint*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const std::vector<Block> blocks = running_blocks(s->host);
    const tf_run_info info = s->host.run_info();
    const std::vector<size_t> chosen =
        s->blocks.empty() ? budgeted_blocks(*s, blocks, info.batch_size * info.seq_len)
                          : named_blocks(*s, blocks.size());
    std::string list;
    for (size_t i : chosen) {
      s->host.check(s->host.api()->stage_set_recompute(ctx, blocks[i].stage, 1));
      list += (list.empty() ? "" : ", ") + std::to_string(i);
    }
    s->host.log(TF_LOG_INFO, "recomputing " + std::to_string(chosen.size()) + " of " +
                                 std::to_string(blocks.size()) + " blocks in backward" +
                                 (list.empty() ? "" : ": " + list));
    return TF_OK;
  });
}

// The kernel's plan follows the stages marked for recomputation; what this
// adds is time: their forward FLOPs once more, against a step's ~3x forward.
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary*,
                          tf_memory_estimate* out) {
  auto* s = static_cast<SelectiveCheckpoint*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->time_factor = tf_sdk::recompute_time_factor(s->host);
    return TF_OK;
  });
}

// `tightfit fit` may add it (ABI 1.23), recomputing the first block or the
// first two: the values from the least to the most memory-saving.
const tf_plugin_search kSearch = {
    .struct_size = sizeof(tf_plugin_search), .label = "selective checkpoint", .stack_order = 40};
const tf_search_value kBlocks[] = {
    tf_sdk::search_value("[0]", "recompute block 0"),
    tf_sdk::search_value("[0, 1]", "recompute blocks 0, 1"),
};
const tf_key_search kBlocksSearch = tf_sdk::key_search(kBlocks);

const tf_config_key kKeys[] = {
    tf_sdk::searched(tf_sdk::key("blocks", TF_VALUE_INT_LIST, "[]",
                                 "blocks to recompute in backward, 0-based (-1 = the last)"),
                     kBlocksSearch),
    tf_sdk::key("activation_budget", TF_VALUE_SIZE, "0",
                "recompute the fewest blocks that bring the activations the blocks keep under "
                "this (e.g. \"64MiB\"); 0 = use blocks"),
};

const tf_strategy_vtable kVtable = {.struct_size = sizeof(tf_strategy_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<SelectiveCheckpoint>,
                                    .configure = configure,
                                    .estimate_memory = estimate_memory};

const tf_plugin_descriptor kDescriptor = tf_sdk::searched(
    tf_sdk::describe(
        TF_PLUGIN_STRATEGY, "selective_checkpoint", "0.1.0",
        "activation checkpointing of chosen blocks, or of the fewest that fit an activation budget",
        kKeys, &kVtable),
    kSearch);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
