#include "ab_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "ab_stats.hpp"
#include "run_summary.hpp"
#include "svg_plot.hpp"

namespace tightfit::host {
using nlohmann::json;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// j[key], or null when j is no object or lacks it (a const json's [] would
// assert on a missing key).
const json& field(const json& j, const std::string& key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::string name_of(const json& variant) {
  const json& n = field(variant, "name");
  return n.is_string() ? n.get<std::string>() : n.dump();
}

double number(const json& j) {
  return j.is_number() ? j.get<double>() : std::nan("");
}

std::vector<double> numbers(const json& j) {
  std::vector<double> out;
  if (j.is_array())
    for (const auto& v : j) out.push_back(number(v));
  return out;
}

bool finished(const json& run) {
  return !run.contains("failed");
}

// Equal as curves: the same length, every value the same (two NaNs too).
bool same_values(const json& a, const json& b) {
  const auto x = numbers(a), y = numbers(b);
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) return false;
  return true;
}

std::string table(const json& report) {
  std::ostringstream o;
  o << "<table><tr>";
  for (const char* h : {"variant", "peak MiB", "weights", "grads", "optimizer", "activations",
                        "adapters", "tokens/s", "wall s", "eval loss", "best eval",
                        "gap to first (95% CI)", "divergences", "backward skipped"})
    o << "<th>" << h << "</th>";
  o << "</tr>";
  for (const auto& v : field(report, "variants")) {
    const json& m = field(v, "mean");
    const json& p = field(m, "peak_bytes");
    std::string gap = fixed(number(field(m, "eval_gap")), 4);
    if (std::isfinite(number(field(m, "eval_gap_ci95"))))
      gap += " ± " + fixed(number(field(m, "eval_gap_ci95")), 4);
    const double skipped = number(field(m, "backward_skipped"));
    o << "<tr><td>" << escape_html(name_of(v)) << "</td><td>"
      << fixed(number(field(p, "total")) / kMiB, 1) << "</td>";
    for (const char* c : {"weights", "grads", "optimizer", "activations", "adapters"})
      o << "<td>" << fixed(number(field(p, c)) / kMiB, 1) << "</td>";
    o << "<td>" << fixed(number(field(m, "tokens_per_s")), 0) << "</td><td>"
      << fixed(number(field(m, "wall_s")), 1) << "</td><td>"
      << fixed(number(field(m, "final_eval_loss")), 4) << "</td><td>"
      << fixed(number(field(m, "best_eval_loss")), 4) << "</td><td>" << gap << "</td><td>"
      << fixed(number(field(m, "divergences")), 0) << "</td><td>"
      << (std::isfinite(skipped) ? fixed(100 * skipped, 0) + "%" : "-") << "</td></tr>";
  }
  o << "</table>";
  return o.str();
}

// Whether a finished run has points on curve `key` (older reports have no such curve).
bool any_curve(const json& report, const char* key) {
  for (const auto& v : field(report, "variants"))
    for (const auto& run : field(v, "runs"))
      if (finished(run) && run.contains("curve") && run["curve"].contains(key) &&
          !run["curve"][key].empty())
        return true;
  return false;
}

// Every finished run of every variant as a line; a variant that repeats an
// earlier one exactly is drawn dashed over it, so both stay visible.
LinePlot curves(const json& report, const std::vector<int>& same, const std::string& title,
                const char* x_key, const char* y_key, const std::string& x_label,
                const std::string& y_label) {
  LinePlot plot{title, x_label, y_label, {}};
  const json& variants = field(report, "variants");
  for (size_t i = 0; i < variants.size(); ++i) {
    const json& v = variants[i];
    bool labelled = false;
    for (const auto& run : field(v, "runs")) {
      if (!finished(run)) continue;
      LineSeries s;
      s.colour = series_colour(i);
      s.y = numbers(field(field(run, "curve"), y_key));
      if (x_key) {
        s.x = numbers(field(field(run, "curve"), x_key));
      } else {
        for (size_t k = 0; k < s.y.size(); ++k) s.x.push_back(static_cast<double>(k + 1));
      }
      s.opacity = labelled ? 0.45 : 0.9;
      if (same[i] >= 0) {
        s.dash = "7,5";
        s.width = 2.6;
      }
      if (!labelled) {
        s.label = name_of(v);
        if (same[i] >= 0) s.label += " (= " + name_of(variants[same[i]]) + ")";
        labelled = true;
      }
      plot.series.push_back(std::move(s));
    }
  }
  // A variant that repeats another is drawn last, dashed, so it lies on top.
  std::stable_partition(plot.series.begin(), plot.series.end(),
                        [](const LineSeries& s) { return s.dash.empty(); });
  return plot;
}

BarPlot memory_bars(const json& report) {
  BarPlot plot;
  plot.title = "Peak tracked memory by category (means over seeds)";
  plot.x_label = "MiB";
  plot.mark_label = "peak of the total";
  for (size_t k = 0; k < 7; ++k) {
    plot.part_names.push_back(kCategories[k]);
    plot.part_colours.push_back(series_colour(k));
  }
  for (const auto& v : field(report, "variants")) {
    BarRow row;
    row.label = name_of(v);
    for (const char* c : kCategories)
      row.parts.push_back(number(field(field(field(v, "mean"), "peak_bytes"), c)) / kMiB);
    row.mark = number(field(field(field(v, "mean"), "peak_bytes"), "total")) / kMiB;
    row.has_mark = std::isfinite(row.mark);
    plot.rows.push_back(std::move(row));
  }
  return plot;
}

BarPlot time_bars(const json& report) {
  BarPlot plot;
  plot.title = "Wall time (mean; circles: each seed; line: 95% interval)";
  plot.x_label = "seconds";
  plot.part_names = {"wall time"};
  plot.part_colours = {"#9ab"};
  for (const auto& v : field(report, "variants")) {
    BarRow row;
    row.label = name_of(v);
    std::vector<double> walls;
    for (const auto& run : field(v, "runs"))
      if (finished(run) && field(run, "wall_s").is_number())
        walls.push_back(field(run, "wall_s").get<double>());
    row.parts = {mean(walls)};
    row.dots = walls;
    row.whisker = walls.size() >= 2 ? ci95(walls) : 0;
    plot.rows.push_back(std::move(row));
  }
  return plot;
}

// What a reader should know before reading the plots.
std::vector<std::string> notes(const json& report, const std::vector<int>& same) {
  std::vector<std::string> out;
  const json& variants = field(report, "variants");
  const auto name = [&](size_t i) { return escape_html(name_of(variants[i])); };
  for (size_t i = 0; i < variants.size(); ++i)
    if (same[i] >= 0)
      out.push_back("<b>" + name(i) + "</b> trains exactly as <b>" + name(same[i]) +
                    "</b>: every seed's training and held-out losses are equal, so its curves "
                    "lie on the other's (drawn dashed over them).");
  const size_t seeds = field(report, "seeds").size();
  if (variants.empty()) return out;
  if (seeds < 2) {
    out.push_back(
        "Each time is one run: nothing here says how much of a time difference is run-to-run "
        "noise. With <code>--seeds 2</code> or more the report says which differences the "
        "seeds resolve.");
    return out;
  }
  const json& base = field(variants[0], "runs");
  for (size_t i = 1; i < variants.size(); ++i) {
    std::vector<double> diffs;
    const json& runs = field(variants[i], "runs");
    for (size_t k = 0; k < runs.size() && k < base.size(); ++k)
      if (finished(runs[k]) && finished(base[k]) && field(runs[k], "wall_s").is_number() &&
          field(base[k], "wall_s").is_number())
        diffs.push_back(field(runs[k], "wall_s").get<double>() -
                        field(base[k], "wall_s").get<double>());
    if (diffs.size() < 2) continue;
    const double m = mean(diffs), ci = ci95(diffs);
    const std::string figure = (m >= 0 ? "+" : "") + fixed(m, 1) + " ± " + fixed(ci, 1) + " s";
    if (std::abs(m) <= ci)
      out.push_back("The wall time of <b>" + name(i) + "</b> is within noise of <b>" + name(0) +
                    "</b>'s (" + figure +
                    ", paired by seed, 95% interval): these runs do not "
                    "tell their speeds apart.");
    else
      out.push_back("<b>" + name(i) + "</b> takes " + figure + " against <b>" + name(0) +
                    "</b> (paired by seed, 95% interval): a difference the seeds resolve.");
  }
  return out;
}

}  // namespace

std::vector<int> identical_curves(const json& report) {
  const json& variants = field(report, "variants");
  std::vector<int> same(variants.size(), -1);
  for (size_t i = 1; i < variants.size(); ++i)
    for (size_t j = 0; j < i && same[i] < 0; ++j) {
      const json &a = field(variants[i], "runs"), &b = field(variants[j], "runs");
      bool equal = a.size() == b.size() && !a.empty();
      for (size_t k = 0; equal && k < a.size(); ++k)
        equal =
            finished(a[k]) && finished(b[k]) &&
            same_values(field(field(a[k], "curve"), "loss"), field(field(b[k], "curve"), "loss")) &&
            same_values(field(field(a[k], "curve"), "eval_loss"),
                        field(field(b[k], "curve"), "eval_loss"));
      if (equal) same[i] = static_cast<int>(j);
    }
  return same;
}

std::string ab_report_html(const json& report) {
  const std::vector<int> same = identical_curves(report);
  std::string names, seeds;
  for (const auto& v : field(report, "variants"))
    names += (names.empty() ? "" : ", ") + escape_html(name_of(v));
  for (const auto& s : field(report, "seeds")) seeds += (seeds.empty() ? "" : ", ") + s.dump();
  std::ostringstream o;
  o << "<!doctype html><html><head><meta charset='utf-8'><title>tightfit ab</title><style>"
       "body{font-family:sans-serif;margin:2em;max-width:1250px}table{border-collapse:collapse}"
       "table{font-size:13px}td,th{border:1px solid #ccc;padding:4px 6px;text-align:right}"
       "td{white-space:nowrap}td:first-child{text-align:"
       "left}svg{display:block;margin:1.5em 0;max-width:100%;height:auto}li{margin:.3em 0}"
       "</style></head><body><h1>tightfit ab: "
    << names << "</h1><p>" << field(report, "seeds").size() << " seed(s) (" << seeds << "), "
    << field(report, "steps").dump()
    << " steps each, the same initial weights and data order per seed; means over seeds; the gap "
       "is the held-out loss minus the first variant's, paired by seed, with its 95% interval "
       "(Student's t).</p>"
    << table(report);
  const auto said = notes(report, same);
  if (!said.empty()) {
    o << "<ul>";
    for (const auto& n : said) o << "<li>" << n << "</li>";
    o << "</ul>";
  }
  o << line_plot_svg(curves(report, same, "Training loss by step", nullptr, "loss", "step", "loss"))
    << line_plot_svg(curves(report, same, "Held-out loss by step", "eval_step", "eval_loss", "step",
                            "held-out loss"))
    << line_plot_svg(curves(report, same, "Training loss by wall time", "elapsed_s", "loss",
                            "seconds", "loss"))
    << bar_plot_svg(memory_bars(report)) << bar_plot_svg(time_bars(report));
  // Online RL: what the runs are trained to raise.
  if (any_curve(report, "reward"))
    o << line_plot_svg(curves(report, same, "Mean reward of the sampled completions by step",
                              "reward_step", "reward", "step", "mean reward"));
  o << "</body></html>\n";
  return o.str();
}

}  // namespace tightfit::host
