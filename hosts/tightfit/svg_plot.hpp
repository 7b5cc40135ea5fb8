// Plots as inline SVG, for reports that travel as one HTML file and need no
// Python or plotting library: lines over x (a gap where a value is not
// finite) and stacked horizontal bars, with axes, ticks at round numbers and
// a legend.
#pragma once

#include <string>
#include <vector>

namespace tightfit::host {

struct LineSeries {
  std::string label;  // in the legend; empty: not listed
  std::string colour;
  std::vector<double> x, y;
  double opacity = 1.0;
  double width = 1.5;
  std::string dash;  // SVG stroke-dasharray, empty: solid
};

struct LinePlot {
  std::string title, x_label, y_label;
  std::vector<LineSeries> series;
};

std::string line_plot_svg(const LinePlot& plot);

// One horizontal bar per row, made of parts in the order of `part_names`;
// `mark` (when finite) draws a tick across the bar at that value, and
// `dots` small circles (one per seed, say).
struct BarRow {
  std::string label;
  std::vector<double> parts;
  double mark = 0;
  bool has_mark = false;
  std::vector<double> dots;
  double whisker = 0;  // a ± interval drawn around the bar's end, 0: none
};

struct BarPlot {
  std::string title, x_label;
  std::vector<std::string> part_names, part_colours;
  std::vector<BarRow> rows;
  std::string mark_label;  // the legend's name for the marks
};

std::string bar_plot_svg(const BarPlot& plot);

// Round tick values covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

// Text for HTML or SVG: & < > " ' escaped.
std::string escape_html(const std::string& s);

// A palette that stays apart for up to ten series (matplotlib's tab10).
const std::string& series_colour(size_t i);

}  // namespace tightfit::host
