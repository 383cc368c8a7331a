// SVG Gantt charts: rows of boxes on a shared time axis.
#include "report/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace tripod {

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string action_fill(const Action& a) {
  // Golden-angle hue steps keep neighbouring micro-batches far apart on the colour wheel.
  const double hue = std::fmod(a.mb * 137.508, 360.0);
  // F light, B dark; a split backward's I a shade lighter than B, its W greyed (it fills gaps).
  switch (a.kind) {
    case ActionKind::Forward: return fmt::format("hsl({:.0f},70%,78%)", hue);
    case ActionKind::Backward: return fmt::format("hsl({:.0f},55%,42%)", hue);
    case ActionKind::Input: return fmt::format("hsl({:.0f},60%,55%)", hue);
    case ActionKind::Weight: return fmt::format("hsl({:.0f},18%,62%)", hue);
  }
  return "#999";
}

namespace {

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks over `span`.
double tick_step(double span, int target) {
  if (span <= 0) return 1;
  double raw = span / target;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

}  // namespace

std::string render_gantt_svg(const GanttChart& ch) {
  const int rows = static_cast<int>(ch.row_labels.size());
  double t_end = 0;
  for (const auto& b : ch.boxes) t_end = std::max(t_end, b.end);
  if (t_end <= 0) t_end = 1;
  // Layout (px): title, rows, axis, footnotes; labels on the left, notes on the right.
  double plot_w = 1000;
  if (ch.label_duration > 0) plot_w = std::clamp(t_end / ch.label_duration * 34, 1000.0, 4000.0);
  // The left margin holds the longest row label (about 6.2 px per character at this size).
  size_t label_chars = 0;
  for (const auto& l : ch.row_labels) label_chars = std::max(label_chars, l.size());
  const double left = std::max(100.0, 14 + 6.2 * static_cast<double>(label_chars)), row_h = 26, top = 40;
  size_t note_chars = 0;
  for (const auto& n : ch.row_notes) note_chars = std::max(note_chars, n.size());
  const double right = 20 + 7.0 * static_cast<double>(note_chars);
  const double width = left + plot_w + right;
  const double axis_y = top + rows * row_h;
  const double height = axis_y + 40 + 16 * static_cast<double>(ch.footnotes.size()) + 10;
  const double scale = plot_w / t_end;

  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      width, height, width, height);
  s += fmt::format("<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  s += fmt::format("<text x=\"{:.0f}\" y=\"22\" font-size=\"14\" font-weight=\"bold\">{}</text>\n", left,
                   xml_escape(ch.title));
  for (int r = 0; r < rows; ++r) {
    const double y = top + r * row_h;
    if (r % 2) s += fmt::format("<rect x=\"{:.0f}\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#f4f4f4\"/>\n",
                                left, y, plot_w, row_h);
    s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 8, y + row_h / 2 + 4,
                     xml_escape(ch.row_labels[r]));
    if (r < static_cast<int>(ch.row_notes.size()))
      s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\">{}</text>\n", left + plot_w + 10, y + row_h / 2 + 4,
                       xml_escape(ch.row_notes[r]));
  }
  // Time axis with ticks and light grid lines.
  const double step = tick_step(t_end, 10);
  s += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"black\"/>\n", left, axis_y,
                   left + plot_w, axis_y);
  for (double t = 0; t <= t_end * (1 + 1e-9); t += step) {
    const double x = left + t * scale;
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.0f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", x, top, x,
                     axis_y + 4);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:g}</text>\n", x, axis_y + 16, t);
  }
  s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", left + plot_w / 2,
                   axis_y + 32, xml_escape(ch.time_unit));
  // The inner bands after every box, so that they lie on top of the spans holding them.
  std::vector<const GanttBox*> order;
  for (const auto& b : ch.boxes)
    if (!b.inner) order.push_back(&b);
  for (const auto& b : ch.boxes)
    if (b.inner) order.push_back(&b);
  for (const GanttBox* bp : order) {
    const GanttBox& b = *bp;
    if (b.row < 0 || b.row >= rows) continue;
    const double x = left + b.start * scale, w = std::max(0.5, (b.end - b.start) * scale);
    const double y = top + b.row * row_h + (b.inner ? row_h - 9 : 2), h = b.inner ? 7 : row_h - 4;
    s += fmt::format(
        "<g><title>{}</title><rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.0f}\" fill=\"{}\" "
        "stroke=\"#333\" stroke-width=\"0.5\"/>",
        xml_escape(b.tooltip.empty() ? b.label : b.tooltip), x, y, w, h, b.fill);
    // Labels only where they fit (about 6.5 px per character at this size).
    if (!b.label.empty() && w >= 6.5 * static_cast<double>(b.label.size()) + 4)
      s += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>", x + w / 2,
                       y + h / 2 + 4, xml_escape(b.label));
    s += "</g>\n";
  }
  for (size_t i = 0; i < ch.footnotes.size(); ++i)
    s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" fill=\"#444\">{}</text>\n", left, axis_y + 52 + 16.0 * i,
                     xml_escape(ch.footnotes[i]));
  s += "</svg>\n";
  return s;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TRIPOD_INPUT_CHECK(out.good(), "{}: cannot write ({})", path, std::strerror(errno));
  out << text;
  out.flush();
  TRIPOD_INPUT_CHECK(out.good(), "{}: error while writing ({})", path, std::strerror(errno));
}

}  // namespace tripod
