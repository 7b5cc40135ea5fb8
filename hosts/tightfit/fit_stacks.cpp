#include "fit_stacks.hpp"

#include <algorithm>
#include <functional>

#include "longest_length.hpp"
#include "session.hpp"

namespace tightfit::host {

void search_stacks(const FitSpace& space, const Recipe& stripped, const PluginRegistry& registry,
                   int ranks, const MachineRates& rates, int64_t budget, SearchResult& r,
                   bool first_fit) {
  const std::vector<FitChoice> choices = enumerate_choices(space);
  r.stacks += choices.size();
  std::vector<FitChoice> too_big;
  for (const FitChoice& c : choices) {
    if (std::any_of(too_big.begin(), too_big.end(),
                    [&](const FitChoice& f) { return c.saves_no_more_than(f); })) {
      ++r.pruned;
      continue;
    }
    std::optional<Planned> p;
    try {
      p = plan_recipe(apply_choice(stripped, space, c), registry, ranks, rates, c);
    } catch (const std::exception& e) {  // a combination the plugins refuse
      ++r.refused;
      std::string why = e.what();
      if (why.rfind("--set: ", 0) == 0) why = why.substr(7);  // the recipe fit made
      ++r.refusals[why.substr(0, why.find('\n'))];
      continue;
    }
    ++r.planned;
    if (!r.smallest || p->plan.tracked_peak < r.smallest->plan.tracked_peak) r.smallest = *p;
    if (p->plan.budget_need() > budget) {
      too_big.push_back(c);
      continue;
    }
    r.fitting.push_back(std::move(*p));
    if (first_fit) return;
  }
}

// The recipe at `tokens` a row, its feed-forward in tiles of `tile` (0: whole,
// the key left out where the recipe has none).
Recipe recipe_at_length(const Recipe& recipe, int64_t tokens, int64_t tile) {
  Recipe r = recipe;
  r.apply_override("data.seq_len=" + std::to_string(tokens));
  const toml::table* run = recipe.table("run");
  if (tile > 0 || (run && run->contains("mlp_tile_tokens")))
    r.apply_override("run.mlp_tile_tokens=" + std::to_string(tile));
  return r;
}

namespace {

// The tile sizes to try: whole, the recipe's own, and 4,096 and 1,024 where
// the model tiles its feed-forward (a model that cannot is refused with
// the key named: then whole alone).
std::vector<int64_t> tile_sizes(const Recipe& recipe, const PluginRegistry& registry) {
  const toml::table* run = recipe.table("run");
  const int64_t own = run ? (*run)["mlp_tile_tokens"].value_or(int64_t{0}) : 0;
  std::vector<int64_t> tiles = {0};
  try {
    SessionOptions dry;
    dry.dry_run = true;
    Recipe probe = recipe;
    probe.apply_override("run.mlp_tile_tokens=1024");
    const Session session(probe, registry, dry);
  } catch (const std::exception&) {
    return tiles;
  }
  for (int64_t t : {own, int64_t{4096}, int64_t{1024}})
    if (t > 0 && std::find(tiles.begin(), tiles.end(), t) == tiles.end()) tiles.push_back(t);
  std::sort(tiles.begin() + 1, tiles.end(), std::greater<>());  // whole, then the largest first
  return tiles;
}

}  // namespace

LongestContextFit search_longest_context(const FitSpace& space, const Recipe& stripped,
                                         const PluginRegistry& registry, int ranks,
                                         const MachineRates& rates, int64_t budget,
                                         SearchResult& r) {
  LongestContextFit out;
  out.tiles = tile_sizes(stripped, registry);
  // A length fits when one stack fits it, whole or in some tile size.
  auto fits = [&](int64_t tokens) {
    for (int64_t tile : out.tiles) {
      SearchResult probe;
      search_stacks(space, recipe_at_length(stripped, tokens, tile), registry, ranks, rates, budget,
                    probe, /*first_fit=*/true);
      if (!probe.fitting.empty()) return true;
      if (probe.planned == 0 && !probe.refusals.empty())  // every stack refused the length
        out.refused = probe.refusals.begin()->first;
    }
    return false;
  };
  out.tokens = longest_length(fits, kContextStep, kLongestContext);
  if (out.tokens == 0) return out;
  // At that length each stack once, with the largest tile it fits (whole
  // first): a smaller tile only saves memory. Tiled, the feed-forward's
  // forward runs again in backward (the cost model prices it), and the
  // stack counts one setting more, so that on a tie whole wins.
  std::vector<std::pair<std::vector<int>, std::vector<char>>> placed;
  for (int64_t tile : out.tiles) {
    const size_t before = r.fitting.size();
    search_stacks(space, recipe_at_length(stripped, out.tokens, tile), registry, ranks, rates,
                  budget, r);
    auto kept = r.fitting.begin() + static_cast<std::ptrdiff_t>(before);
    for (auto p = kept; p != r.fitting.end(); ++p) {
      const auto key = std::make_pair(p->choice.at, p->choice.in);
      if (std::find(placed.begin(), placed.end(), key) != placed.end()) continue;
      placed.push_back(key);
      if (tile > 0) {
        p->choice.described += " + feed-forward in tiles of " + std::to_string(tile);
        ++p->choice.added;
        ++p->choice.settings;
      }
      if (kept != p) *kept = std::move(*p);
      ++kept;
    }
    r.fitting.erase(kept, r.fitting.end());
  }
  return out;
}

}  // namespace tightfit::host
