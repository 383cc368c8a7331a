// SVG Gantt charts of pipeline timelines (simulated schedules and measured traces): one row per
// rank, one box per event, a note beside each row.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/action.h"

namespace tripod {

struct GanttBox {
  int row = 0;
  double start = 0, end = 0;  // in the chart's time unit
  std::string fill;           // CSS colour
  std::string label;          // drawn inside the box when it fits
  std::string tooltip;        // shown on hover
  // A band in the lower part of the row, drawn over the boxes it lies in (communication inside a
  // forward or backward span).
  bool inner = false;
};

struct GanttChart {
  std::string title;
  std::string time_unit;                // axis label, e.g. "time (ms)"
  std::vector<std::string> row_labels;  // left of each row
  std::vector<std::string> row_notes;   // right of each row (may be empty)
  std::vector<GanttBox> boxes;
  std::vector<std::string> footnotes;   // lines under the chart
  // When > 0, the plot is made wide enough (up to 4000 px) for a box this long to hold a label.
  double label_duration = 0;
};

// The chart as a standalone SVG document.
std::string render_gantt_svg(const GanttChart& chart);

// Colour of an action: hue by micro-batch, light for forward, dark for backward.
std::string action_fill(const Action& a);

// `text` with &, <, >, " escaped for XML.
std::string xml_escape(const std::string& text);

// Writes `text` to `path` (InputError naming the path when it cannot be written).
void write_text_file(const std::string& path, const std::string& text);

}  // namespace tripod
