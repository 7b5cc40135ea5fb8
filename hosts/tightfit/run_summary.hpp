// A run's figures from its metrics.jsonl, as `tightfit ab` and `fit --verify`
// report them.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

namespace tightfit::host {

// The tracked-memory categories a run's metrics carry peaks for.
extern const char* const kCategories[7];

// steps, wall_s, tokens_per_s, final/best eval and train loss, divergences,
// backward passes (and the share skipped), peak_bytes per category and
// total (the last line's running maxima), and the curves (loss, elapsed_s,
// peak_total, eval). Throws std::runtime_error for a missing or empty file.
nlohmann::json summarize(const std::filesystem::path& metrics);

}  // namespace tightfit::host
