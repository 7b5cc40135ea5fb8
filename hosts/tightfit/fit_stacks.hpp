// Planning the stacks of a fit space against a budget: every stack, the most
// memory-saving first (one that does not fit rules out every stack saving no
// more on any knob); and for `fit --longest-context`, the longest row that
// some stack, its feed-forward whole or in tiles, fits.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fit_planned.hpp"
#include "fit_search.hpp"
#include "machine_rates.hpp"
#include "plugin_loader.hpp"
#include "recipe.hpp"

namespace tightfit::host {

struct SearchResult {
  std::vector<Planned> fitting;
  std::optional<Planned> smallest;
  size_t stacks = 0;
  int pruned = 0, refused = 0, planned = 0;
  std::map<std::string, int> refusals;  // why the plugins refused stacks: how many each
};

// Plans the stacks of `space` over `stripped` into `r`; with `first_fit`,
// stops at the first that fits.
void search_stacks(const FitSpace& space, const Recipe& stripped, const PluginRegistry& registry,
                   int ranks, const MachineRates& rates, int64_t budget, SearchResult& r,
                   bool first_fit = false);

// The recipe at `tokens` a row, its feed-forward in tiles of `tile` (0:
// whole, the key left out where the recipe has none).
Recipe recipe_at_length(const Recipe& recipe, int64_t tokens, int64_t tile);

// `fit --longest-context`: the longest data.seq_len (to 256 tokens) that
// some stack fits, with the feed-forward whole or in tiles ([run]
// mlp_tile_tokens: the recipe's own, 4,096 and 1,024, where the model
// tiles), and every stack that fits that length in `r`, once each, with the
// largest tile it fits in (their recipes set to it, a tiled one described
// so). 0 when not even 256 tokens fit.
struct LongestContextFit {
  int64_t tokens = 0;
  std::vector<int64_t> tiles;  // the tile sizes tried (0: whole)
  std::string refused;         // what refused a longer row (the model's positions), if anything
};
LongestContextFit search_longest_context(const FitSpace& space, const Recipe& stripped,
                                         const PluginRegistry& registry, int ranks,
                                         const MachineRates& rates, int64_t budget,
                                         SearchResult& r);

}  // namespace tightfit::host
