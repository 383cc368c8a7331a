// Line charts as inline SVG (report/line_chart.h).
#include "report/line_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "report/svg.h"

namespace tripod {

using nlohmann::json;

namespace {

std::string esc(const std::string& s) { return xml_escape(s); }

const char* format_js_name(ValueFormat a) {
  switch (a) {
    case ValueFormat::Si: return "si";
    case ValueFormat::Percent: return "pct";
    case ValueFormat::Sci: return "sci";
    default: return "plain";
  }
}

// A "nice" step (1, 2 or 5 times a power of ten) giving about `target` intervals over `span`.
double nice_step(double span, int target) {
  if (!(span > 0)) return 1;
  const double raw = span / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * p * (1 + 1e-9)) return m * p;
  return 10 * p;
}

std::string format_tick(double v, ValueFormat axis, double step) {
  if (std::fabs(v) < step * 1e-6) return "0";
  auto decimals = [](double s) { return std::max(0, static_cast<int>(-std::floor(std::log10(s) + 1e-9))); };
  switch (axis) {
    case ValueFormat::Percent: return fmt::format("{:.{}f}%", 100 * v, decimals(100 * step));
    case ValueFormat::Sci: return v == 0 ? "0" : fmt::format("{:.1e}", v);
    case ValueFormat::Si: {
      double scale = 1;
      const char* suffix = "";
      const double a = std::max(std::fabs(v), step);
      if (a >= 1e9) scale = 1e9, suffix = "G";
      else if (a >= 1e6) scale = 1e6, suffix = "M";
      else if (a >= 1e3) scale = 1e3, suffix = "k";
      return fmt::format("{:.{}f}{}", v / scale, decimals(step / scale), suffix);
    }
    default: return fmt::format("{:.{}f}", v, decimals(step));
  }
}

// (lo, hi) of the finite values of every series.
std::pair<double, double> finite_range(const std::vector<Series>& ss, bool xs) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : ss)
    for (size_t i = 0; i < s.x.size(); ++i) {
      const double v = xs ? s.x[i] : s.y[i];
      if (!std::isfinite(s.y[i]) || !std::isfinite(v)) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  return {lo, hi};
}

}  // namespace

std::string render_line_chart(const LineChart& c, json& js) {
  const double left = 70, right = 18, top = 12, bottom = 44;
  const double pw = c.width - left - right, ph = c.height - top - bottom;
  auto [x0, x1] = finite_range(c.series, true);
  auto [y0, y1] = finite_range(c.series, false);
  if (!std::isfinite(x0)) x0 = 0, x1 = 1;
  if (x1 <= x0) x0 -= 1, x1 += 1;
  if (!std::isfinite(y0)) y0 = 0, y1 = 1;
  if (c.from_zero && y0 >= 0) y0 = 0;
  if (y1 <= y0) {
    const double pad = std::fabs(y0) > 0 ? std::fabs(y0) * 0.1 : 1;
    y0 = c.from_zero && y0 >= 0 ? 0 : y0 - pad;
    y1 += pad;
  }
  const double ystep = nice_step(y1 - y0, 5);
  y0 = std::floor(y0 / ystep + 1e-9) * ystep;
  y1 = std::ceil(y1 / ystep - 1e-9) * ystep;
  const double xstep = std::max(1.0, nice_step(x1 - x0, 8));
  auto X = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto Y = [&](double y) { return top + (y1 - y) / (y1 - y0) * ph; };

  std::string s = fmt::format(
      "<svg class=\"chart\" data-chart=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\" "
      "font-size=\"12\">\n",
      c.id, c.width, c.height, esc(c.y_label));
  // Grid and axes.
  for (double t = y0; t <= y1 + ystep * 1e-6; t += ystep) {
    const double y = Y(t);
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e6e8ec\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"#5b6475\">{}</text>\n",
                     left, y, left + pw, y, left - 6, y + 4, format_tick(t, c.format, ystep));
  }
  for (double t = std::ceil(x0 / xstep - 1e-9) * xstep; t <= x1 + xstep * 1e-6; t += xstep) {
    const double x = X(t);
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#c9cdd4\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#5b6475\">{:.0f}</text>\n",
                     x, top + ph, x, top + ph + 4, x, top + ph + 17, t);
  }
  s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#8a909c\"/>\n", left,
                   top + ph, left + pw);
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#5b6475\">step</text>\n",
                   left + pw / 2, top + ph + 35);
  s += fmt::format("<text transform=\"translate(16 {:.1f}) rotate(-90)\" text-anchor=\"middle\" "
                   "fill=\"#5b6475\">{}</text>\n",
                   top + ph / 2, esc(c.y_label));

  json jseries = json::array();
  for (const auto& se : c.series) {
    // Long series keep, per pixel column, their first, lowest, highest and last points, so
    // spikes survive and the path stays a few thousand points.
    std::vector<size_t> keep;
    const size_t n = se.x.size();
    if (n > 3 * static_cast<size_t>(pw)) {
      std::map<long, std::array<size_t, 4>> cols;
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(se.y[i])) {
          keep.push_back(i);  // a gap stays a gap
          continue;
        }
        const long col = std::lround(X(se.x[i]));
        auto [it, fresh] = cols.try_emplace(col, std::array<size_t, 4>{i, i, i, i});
        if (fresh) continue;
        auto& a = it->second;
        if (se.y[i] < se.y[a[1]]) a[1] = i;
        if (se.y[i] > se.y[a[2]]) a[2] = i;
        a[3] = i;
      }
      for (const auto& [col, a] : cols) keep.insert(keep.end(), a.begin(), a.end());
      std::sort(keep.begin(), keep.end());
      keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    } else {
      for (size_t i = 0; i < n; ++i) keep.push_back(i);
    }
    std::string d;
    bool pen = false;
    size_t finite = 0;
    for (size_t i : keep) {
      if (!std::isfinite(se.y[i])) {
        pen = false;
        continue;
      }
      ++finite;
      d += fmt::format("{}{:.1f},{:.1f}", pen ? "L" : "M", X(se.x[i]), Y(se.y[i]));
      pen = true;
    }
    s += fmt::format("<path class=\"series\" data-series=\"{}\" d=\"{}\" fill=\"none\" stroke=\"{}\" "
                     "stroke-width=\"{}\" stroke-opacity=\"{}\" stroke-linejoin=\"round\"/>\n",
                     esc(se.name), d, se.color, se.width, se.opacity);
    if (se.markers || (finite <= 60 && se.opacity >= 1 && !se.trend)) {
      for (size_t i = 0; i < n; ++i)
        if (std::isfinite(se.y[i]))
          s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.2\" fill=\"{}\"><title>{} step {:.0f}: {:.6g}"
                           "</title></circle>\n",
                           X(se.x[i]), Y(se.y[i]), se.color, esc(se.name), se.x[i], se.y[i]);
    }
    if (se.hover) {
      json xs = json::array(), ys = json::array();
      for (size_t i = 0; i < n; ++i) {
        xs.push_back(static_cast<int64_t>(se.x[i]));
        if (std::isfinite(se.y[i])) ys.push_back(std::stod(fmt::format("{:.6g}", se.y[i])));
        else ys.push_back(nullptr);
      }
      jseries.push_back({{"n", se.name}, {"c", se.color}, {"x", std::move(xs)}, {"y", std::move(ys)}});
    }
  }
  for (int64_t step : c.flagged) {
    const double x = X(static_cast<double>(step));
    s += fmt::format("<path d=\"M{:.1f},{:.1f}l-4,7h8z\" fill=\"#d62728\"><title>step {}: update skipped "
                     "(non-finite loss or grad norm)</title></path>\n",
                     x, top + ph - 8, step);
  }
  s += fmt::format("<line class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#333\" "
                   "stroke-dasharray=\"3 3\" visibility=\"hidden\"/>\n",
                   top, top + ph);
  s += "</svg>\n";
  js[c.id] = {{"px", {left, left + pw}}, {"dom", {x0, x1}}, {"fmt", format_js_name(c.format)}, {"series", jseries}};
  return s;
}

LineChart make_chart(std::string id, ValueFormat format, bool from_zero, std::string y_label, int width, int height) {
  LineChart c;
  c.id = std::move(id);
  c.format = format;
  c.from_zero = from_zero;
  c.y_label = std::move(y_label);
  c.width = width;
  c.height = height;
  return c;
}

std::string legend_html(const std::vector<Series>& ss, bool flagged) {
  std::string h = "<div class=\"legend\">";
  for (const auto& s : ss)
    h += fmt::format("<span><i class=\"sw\" style=\"background:{};opacity:{}\"></i>{}</span>", s.color,
                     std::max(0.5, s.opacity), esc(s.name));
  if (flagged) h += "<span><i class=\"tri\"></i>update skipped (non-finite)</span>";
  return h + "</div>\n";
}

std::string chart_panel(const std::string& title, const std::string& sub, const LineChart& c, json& js) {
  std::string h = fmt::format("<section class=\"panel\" id=\"panel-{}\"><h2>{}</h2>", c.id, esc(title));
  if (!sub.empty()) h += fmt::format("<div class=\"panel-sub\">{}</div>", sub);
  h += legend_html(c.series, !c.flagged.empty());
  h += render_line_chart(c, js);
  h += fmt::format("<div class=\"readout\" id=\"readout-{0}\" data-hint=\"{1}\">{1}</div></section>\n", c.id,
                   "hover over the chart for values");
  return h;
}

}  // namespace tripod
