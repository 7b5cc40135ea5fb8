#include "svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace tightfit::host {
namespace {

// The drawing's frame, in SVG units: the plot area and the legend beside it.
constexpr double kWidth = 980, kHeight = 340;
constexpr double kLeft = 72, kRight = 700, kTop = 40, kBottom = 290, kLegendX = 716;

std::string num(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Digits after the point that tell ticks `step` apart.
int tick_digits(double step) {
  return step >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
}

std::string clip_label(const std::string& s, size_t most = 40) {
  return s.size() <= most ? s : s.substr(0, most - 1) + "~";
}

void open_svg(std::ostringstream& o, const std::string& title) {
  o << "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 " << kWidth << ' ' << kHeight
    << "' width='" << kWidth << "' height='" << kHeight
    << "' font-family='sans-serif' font-size='12' role='img'><title>" << escape_html(title)
    << "</title><rect width='100%' height='100%' fill='white'/>"
    << "<text x='" << kLeft << "' y='22' font-size='15' font-weight='bold'>" << escape_html(title)
    << "</text>";
}

struct Scale {
  double lo, hi, from, to;  // data [lo, hi] onto [from, to]
  double operator()(double v) const {
    return hi > lo ? from + (v - lo) / (hi - lo) * (to - from) : (from + to) / 2;
  }
};

// The range of the finite values, widened when it is a point.
std::pair<double, double> finite_range(const std::vector<const std::vector<double>*>& all) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto* v : all)
    for (double x : *v)
      if (std::isfinite(x)) {
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
  if (!std::isfinite(lo)) return {0, 1};
  if (hi == lo) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.05;
    return {lo - pad, hi + pad};
  }
  return {lo, hi};
}

void x_axis(std::ostringstream& o, const Scale& sx, const std::vector<double>& ticks,
            const std::string& label) {
  const int digits = ticks.size() > 1 ? tick_digits(ticks[1] - ticks[0]) : 0;
  o << "<line x1='" << kLeft << "' y1='" << kBottom << "' x2='" << kRight << "' y2='" << kBottom
    << "' stroke='#333'/>";
  for (double t : ticks) {
    const double x = sx(t);
    o << "<line x1='" << num(x, 1) << "' y1='" << kBottom << "' x2='" << num(x, 1) << "' y2='"
      << kBottom + 5 << "' stroke='#333'/><text x='" << num(x, 1) << "' y='" << kBottom + 18
      << "' text-anchor='middle'>" << num(t, digits) << "</text>";
  }
  o << "<text x='" << (kLeft + kRight) / 2 << "' y='" << kBottom + 38 << "' text-anchor='middle'>"
    << escape_html(label) << "</text>";
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (raw <= m * mag * (1 + 1e-9)) {
      step = m * mag;
      break;
    }
  std::vector<double> out;
  const double first = std::ceil(lo / step - 1e-9);
  for (int k = 0; k < 50; ++k) {
    const double t = (first + k) * step;  // a multiple, never a running sum's drift
    if (t > hi + step * 1e-9) break;
    out.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return out;
}

std::string escape_html(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  return out;
}

const std::string& series_colour(size_t i) {
  static const std::string kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return kColours[i % 10];
}

std::string line_plot_svg(const LinePlot& plot) {
  std::vector<const std::vector<double>*> xs, ys;
  for (const auto& s : plot.series) {
    xs.push_back(&s.x);
    ys.push_back(&s.y);
  }
  auto [x_lo, x_hi] = finite_range(xs);
  auto [y_lo, y_hi] = finite_range(ys);
  const std::vector<double> x_ticks = nice_ticks(x_lo, x_hi), y_ticks = nice_ticks(y_lo, y_hi);
  if (x_ticks.size() > 1) x_lo = std::min(x_lo, x_ticks.front());
  if (y_ticks.size() > 1) {
    y_lo = std::min(y_lo, y_ticks.front());
    y_hi = std::max(y_hi, y_ticks.back());
  }
  const Scale sx{x_lo, x_hi, kLeft, kRight}, sy{y_lo, y_hi, kBottom, kTop};
  std::ostringstream o;
  open_svg(o, plot.title);
  const int digits = y_ticks.size() > 1 ? tick_digits(y_ticks[1] - y_ticks[0]) : 2;
  for (double t : y_ticks) {
    const double y = sy(t);
    o << "<line x1='" << kLeft << "' y1='" << num(y, 1) << "' x2='" << kRight << "' y2='"
      << num(y, 1) << "' stroke='#e4e4e4'/><text x='" << kLeft - 6 << "' y='" << num(y + 4, 1)
      << "' text-anchor='end'>" << num(t, digits) << "</text>";
  }
  o << "<line x1='" << kLeft << "' y1='" << kTop << "' x2='" << kLeft << "' y2='" << kBottom
    << "' stroke='#333'/><text transform='translate(18," << (kTop + kBottom) / 2
    << ") rotate(-90)' text-anchor='middle'>" << escape_html(plot.y_label) << "</text>";
  x_axis(o, sx, x_ticks, plot.x_label);
  // Each series as polylines broken where a value is not finite.
  for (const auto& s : plot.series) {
    std::string points;
    auto flush = [&] {
      if (points.empty()) return;
      o << "<polyline fill='none' stroke='" << s.colour << "' stroke-width='" << s.width
        << "' stroke-opacity='" << s.opacity << "'"
        << (s.dash.empty() ? "" : " stroke-dasharray='" + s.dash + "'") << " points='" << points
        << "'/>";
      points.clear();
    };
    const size_t n = std::min(s.x.size(), s.y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        flush();
        continue;
      }
      points += num(sx(s.x[i]), 1) + "," + num(sy(s.y[i]), 1) + " ";
    }
    if (n == 1 && std::isfinite(s.x[0]) && std::isfinite(s.y[0]))  // one point: a dot
      o << "<circle cx='" << num(sx(s.x[0]), 1) << "' cy='" << num(sy(s.y[0]), 1)
        << "' r='3' fill='" << s.colour << "'/>";
    flush();
  }
  double ly = kTop + 6;
  for (const auto& s : plot.series) {
    if (s.label.empty()) continue;
    o << "<line x1='" << kLegendX << "' y1='" << ly << "' x2='" << kLegendX + 24 << "' y2='" << ly
      << "' stroke='" << s.colour << "' stroke-width='" << std::max(2.0, s.width) << "'"
      << (s.dash.empty() ? "" : " stroke-dasharray='" + s.dash + "'") << "/><text x='"
      << kLegendX + 30 << "' y='" << ly + 4 << "'>" << escape_html(clip_label(s.label))
      << "</text>";
    ly += 18;
  }
  o << "</svg>";
  return o.str();
}

std::string bar_plot_svg(const BarPlot& plot) {
  double hi = 0;
  for (const auto& r : plot.rows) {
    double sum = 0;
    for (double p : r.parts)
      if (std::isfinite(p)) sum += p;
    hi = std::max({hi, sum + (std::isfinite(r.whisker) ? r.whisker : 0),
                   r.has_mark && std::isfinite(r.mark) ? r.mark : 0});
    for (double d : r.dots)
      if (std::isfinite(d)) hi = std::max(hi, d);
  }
  std::vector<double> ticks = nice_ticks(0, hi > 0 ? hi : 1);
  if (ticks.size() > 1 && ticks.back() < hi)  // the axis ends at a tick past the longest bar
    ticks.push_back(ticks.back() + (ticks[1] - ticks[0]));
  const Scale sx{0, std::max(ticks.back(), hi > 0 ? hi : 1), kLeft + 150, kRight};
  std::ostringstream o;
  open_svg(o, plot.title);
  const double band = (kBottom - kTop) / std::max<double>(1, static_cast<double>(plot.rows.size()));
  const double bar = std::min(28.0, band * 0.6);
  for (double t : ticks)
    o << "<line x1='" << num(sx(t), 1) << "' y1='" << kTop << "' x2='" << num(sx(t), 1) << "' y2='"
      << kBottom << "' stroke='#e4e4e4'/>";
  for (size_t i = 0; i < plot.rows.size(); ++i) {
    const BarRow& r = plot.rows[i];
    const double mid = kTop + band * (static_cast<double>(i) + 0.5), top = mid - bar / 2;
    o << "<text x='" << kLeft + 144 << "' y='" << num(mid + 4, 1) << "' text-anchor='end'>"
      << escape_html(clip_label(r.label, 26)) << "</text>";
    double at = 0;
    bool any = false;
    for (size_t k = 0; k < r.parts.size(); ++k) {
      if (!std::isfinite(r.parts[k]) || r.parts[k] <= 0) continue;
      any = true;
      o << "<rect x='" << num(sx(at), 1) << "' y='" << num(top, 1) << "' width='"
        << num(sx(at + r.parts[k]) - sx(at), 1) << "' height='" << num(bar, 1) << "' fill='"
        << plot.part_colours[k % plot.part_colours.size()] << "'><title>"
        << escape_html(r.label + ": " + plot.part_names[k % plot.part_names.size()] + " " +
                       num(r.parts[k], 1))
        << "</title></rect>";
      at += r.parts[k];
    }
    if (!any)
      o << "<text x='" << num(sx(0) + 4, 1) << "' y='" << num(mid + 4, 1)
        << "' fill='#a00'>no figures (every run failed)</text>";
    if (r.whisker > 0 && std::isfinite(r.whisker) && any)
      o << "<line x1='" << num(sx(at - r.whisker), 1) << "' y1='" << num(mid, 1) << "' x2='"
        << num(sx(at + r.whisker), 1) << "' y2='" << num(mid, 1)
        << "' stroke='#222' stroke-width='1.5'/>";
    if (r.has_mark && std::isfinite(r.mark))
      o << "<line x1='" << num(sx(r.mark), 1) << "' y1='" << num(top - 4, 1) << "' x2='"
        << num(sx(r.mark), 1) << "' y2='" << num(top + bar + 4, 1)
        << "' stroke='black' stroke-width='2.5'/>";
    for (double d : r.dots)
      if (std::isfinite(d))
        o << "<circle cx='" << num(sx(d), 1) << "' cy='" << num(mid, 1)
          << "' r='3' fill='white' stroke='black'/>";
  }
  Scale axis = sx;
  o << "<line x1='" << num(sx(0), 1) << "' y1='" << kTop << "' x2='" << num(sx(0), 1) << "' y2='"
    << kBottom << "' stroke='#333'/>";
  {
    const int digits = ticks.size() > 1 ? tick_digits(ticks[1] - ticks[0]) : 0;
    o << "<line x1='" << num(sx(0), 1) << "' y1='" << kBottom << "' x2='" << kRight << "' y2='"
      << kBottom << "' stroke='#333'/>";
    for (double t : ticks)
      o << "<text x='" << num(axis(t), 1) << "' y='" << kBottom + 18 << "' text-anchor='middle'>"
        << num(t, digits) << "</text>";
    o << "<text x='" << (sx(0) + kRight) / 2 << "' y='" << kBottom + 38 << "' text-anchor='middle'>"
      << escape_html(plot.x_label) << "</text>";
  }
  double ly = kTop + 6;
  if (plot.part_names.size() > 1)
    for (size_t k = 0; k < plot.part_names.size(); ++k) {
      o << "<rect x='" << kLegendX << "' y='" << ly - 6 << "' width='24' height='12' fill='"
        << plot.part_colours[k % plot.part_colours.size()] << "'/><text x='" << kLegendX + 30
        << "' y='" << ly + 4 << "'>" << escape_html(plot.part_names[k]) << "</text>";
      ly += 18;
    }
  if (!plot.mark_label.empty())
    o << "<line x1='" << kLegendX + 12 << "' y1='" << ly - 8 << "' x2='" << kLegendX + 12
      << "' y2='" << ly + 8 << "' stroke='black' stroke-width='2.5'/><text x='" << kLegendX + 30
      << "' y='" << ly + 4 << "'>" << escape_html(plot.mark_label) << "</text>";
  o << "</svg>";
  return o.str();
}

}  // namespace tightfit::host
