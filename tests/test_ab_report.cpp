// tightfit ab's report.html, made by the host (hosts/tightfit/ab_report.cpp,
// svg_plot.cpp): plots drawn from the runs' numbers, gaps where a loss is not
// finite, exact variants found and said, names escaped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "ab_report.hpp"
#include "svg_plot.hpp"

namespace tightfit::host {
namespace {

using nlohmann::json;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

void expect_ticks(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], want[k], 1e-12) << k;
}

TEST(SvgPlot, TicksAreRoundNumbersCoveringTheRange) {
  expect_ticks(nice_ticks(0, 1), {0, 0.2, 0.4, 0.6, 0.8, 1.0});
  expect_ticks(nice_ticks(2.83, 5.51), {3, 4, 5});
  expect_ticks(nice_ticks(0, 2300), {0, 500, 1000, 1500, 2000});
  const auto small = nice_ticks(-0.013, 0.012);
  ASSERT_FALSE(small.empty());
  EXPECT_GE(small.front(), -0.013);
  EXPECT_LE(small.back(), 0.012);
  EXPECT_TRUE(std::count(small.begin(), small.end(), 0.0));  // zero is exactly zero
}

TEST(SvgPlot, ALossThatIsNotFiniteBreaksTheLine) {
  LinePlot plot{"t", "step", "loss", {}};
  plot.series.push_back({"a", "#000", {1, 2, 3, 4, 5}, {3, 2.5, NAN, 2.2, 2.1}});
  const std::string svg = line_plot_svg(plot);
  EXPECT_EQ(count(svg, "<polyline"), 2u) << svg;
  EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;
  plot.series[0].y = {3, 2.5, 2.4, 2.2, 2.1};
  EXPECT_EQ(count(line_plot_svg(plot), "<polyline"), 1u);
}

TEST(SvgPlot, TextIsEscaped) {
  EXPECT_EQ(escape_html("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
}

json run(std::vector<double> loss, std::vector<double> eval, double wall) {
  json r = {{"wall_s", wall},
            {"tokens_per_s", 100.0},
            {"peak_bytes", {{"weights", 1 << 20}, {"total", 2 << 20}}},
            {"curve",
             {{"loss", loss},
              {"elapsed_s", json::array({1.0, 2.0, 3.0})},
              {"eval_step", json::array({3})},
              {"eval_loss", eval}}}};
  return r;
}

json report_of(std::vector<std::pair<std::string, std::vector<json>>> variants) {
  json report = {{"steps", 3}, {"seeds", json::array()}, {"variants", json::array()}};
  for (size_t k = 0; k < variants[0].second.size(); ++k) report["seeds"].push_back(7 + k);
  for (auto& [name, runs] : variants)
    report["variants"].push_back({{"name", name},
                                  {"runs", runs},
                                  {"mean",
                                   {{"peak_bytes", {{"weights", 1 << 20}, {"total", 2 << 20}}},
                                    {"wall_s", runs[0].value("wall_s", NAN)}}}});
  return report;
}

TEST(AbReport, FindsVariantsThatTrainExactlyAsAnother) {
  const json a = run({3, 2, 1}, {1.5}, 10), b = run({3, 2, 1.0000001}, {1.5}, 10);
  json failed = {{"failed", true}};
  const json report = report_of(
      {{"plain", {a, a}}, {"checkpoint", {a, a}}, {"other", {a, b}}, {"broken", {failed, failed}}});
  EXPECT_EQ(identical_curves(report), (std::vector<int>{-1, 0, -1, -1}));
  const std::string html = ab_report_html(report);
  EXPECT_NE(html.find("<b>checkpoint</b> trains exactly as <b>plain</b>"), std::string::npos);
  EXPECT_EQ(html.find("<b>other</b> trains exactly"), std::string::npos);
  EXPECT_EQ(count(html, "<svg "), 5u);
  EXPECT_NE(html.find("no figures (every run failed)"), std::string::npos);
}

TEST(AbReport, SaysWhetherTheSeedsTellTimesApart) {
  const json fast1 = run({3, 2, 1}, {1.5}, 10), fast2 = run({3, 2, 1}, {1.4}, 10.2);
  const json slow1 = run({3, 2, 1.1}, {1.5}, 20), slow2 = run({3, 2, 1.2}, {1.4}, 20.4);
  const json same1 = run({3, 2, 1.3}, {1.5}, 9.8), same2 = run({3, 2, 1.4}, {1.4}, 10.6);
  const std::string html = ab_report_html(
      report_of({{"base", {fast1, fast2}}, {"slow", {slow1, slow2}}, {"same", {same1, same2}}}));
  EXPECT_NE(html.find("<b>slow</b> takes +10.1"), std::string::npos) << html;
  EXPECT_NE(html.find("The wall time of <b>same</b> is within noise"), std::string::npos) << html;
}

// Runs of a schedule that samples (online RL) get a curve of their mean
// reward; others do not.
TEST(AbReport, DrawsTheMeanRewardWhenTheRunsLogOne) {
  const json plain = run({3, 2, 1}, {1.5}, 10);
  EXPECT_EQ(ab_report_html(report_of({{"a", {plain}}})).find("Mean reward"), std::string::npos);
  json rl = plain;
  rl["curve"]["reward_step"] = json::array({1, 2, 3});
  rl["curve"]["reward"] = json::array({0.1, 0.25, 0.4});
  const std::string html = ab_report_html(report_of({{"grpo", {rl}}}));
  EXPECT_NE(html.find("Mean reward of the sampled completions by step"), std::string::npos);
  EXPECT_EQ(count(html, "<svg "), 6u);
}

TEST(AbReport, AVariantNameIsTextNotMarkup) {
  const json a = run({3, 2, 1}, {1.5}, 10), b = run({3, 2, 0.5}, {1.5}, 10);
  const std::string html =
      ab_report_html(report_of({{"<script>alert(1)</script>", {a}}, {"b", {b}}}));
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
}

}  // namespace
}  // namespace tightfit::host
