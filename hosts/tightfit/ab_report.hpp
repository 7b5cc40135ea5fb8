// `tightfit ab`'s report.html, written by the host itself: the table, the
// notes (variants whose curves are another's exactly; timings within
// run-to-run noise) and inline SVG plots — loss by step and by wall time with
// every seed's run, held-out loss, peak memory by category, wall time — in
// one self-contained file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tightfit::host {

// For each variant, the index of an earlier variant whose every seed's
// training and held-out losses it repeats exactly (an exact strategy), or -1.
std::vector<int> identical_curves(const nlohmann::json& report);

// `report` is ab.json's content (with each variant's "mean").
std::string ab_report_html(const nlohmann::json& report);

}  // namespace tightfit::host
