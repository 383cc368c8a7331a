// Line charts of a run's series over the steps, as inline SVG for the report's page: axes with
// "nice" ticks, a gap at every non-finite value, long series thinned per pixel column so spikes
// survive, markers on sparse ones, and each chart's data for the page's hover readout.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tripod {

// How the y axis and the readout print values: 0.123, 12.3k, 12.3%, 1.2e-04.
enum class ValueFormat { Plain, Si, Percent, Sci };

struct Series {
  std::string name, color;
  std::vector<double> x, y;
  bool markers = false;  // always draw the points (sparse series: validation)
  bool trend = false;    // a smoothed line: never the points
  double opacity = 1, width = 1.8;
  bool hover = true;  // listed in the hover readout
};

struct LineChart {
  std::string id;  // unique in the page
  std::vector<Series> series;
  ValueFormat format = ValueFormat::Plain;
  bool from_zero = false;
  std::string y_label;
  std::vector<int64_t> flagged;  // steps marked under the plot (skipped updates)
  int width = 1200, height = 320;
};

LineChart make_chart(std::string id, ValueFormat format, bool from_zero, std::string y_label, int width, int height);

// The SVG of a chart; its data for the hover readout goes to `js[c.id]`.
std::string render_line_chart(const LineChart& c, nlohmann::json& js);

// The series' colour swatches (and the skipped-update marker when `flagged`).
std::string legend_html(const std::vector<Series>& ss, bool flagged);

// A page section: title, subtitle (HTML), legend, chart and its readout line.
std::string chart_panel(const std::string& title, const std::string& sub, const LineChart& c, nlohmann::json& js);

}  // namespace tripod
