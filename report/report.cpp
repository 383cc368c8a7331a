// The run report: reads a run directory and draws one self-contained HTML page (see report.h).
#include "report/report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/version.h"
#include "config/config.h"
#include "config/layout.h"
#include "plan/plan_check.h"
#include "report/report_assets.h"
#include "report/line_chart.h"
#include "report/svg.h"
#include "report/trace_merge.h"
#include "core/format.h"
#include "train/run_files.h"

namespace tripod {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  TRIPOD_INPUT_CHECK(in.good(), "{}: cannot read ({})", p.string(), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string esc(const std::string& s) { return xml_escape(s); }

// Exponential moving average with bias correction (no lag at the start), skipping non-finite
// values; the window grows with the series so long runs get a readable trend.
std::vector<double> smooth(const std::vector<double>& y) {
  const double window = std::max(2.0, static_cast<double>(y.size()) / 40.0);
  const double a = 2.0 / (window + 1.0);
  std::vector<double> out(y.size(), kNaN);
  double acc = 0, weight = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (std::isfinite(y[i])) {
      acc = (1 - a) * acc + a * y[i];
      weight = (1 - a) * weight + a;
    }
    if (weight > 0) out[i] = acc / weight;
  }
  return out;
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// ---- memory bars ---------------------------------------------------------------------------

const std::vector<std::string>& category_order() {
  static const std::vector<std::string> order = {"params", "grads", "optimizer", "activations", "workspace", "comm"};
  return order;
}

std::string category_color(const std::string& cat) {
  static const std::map<std::string, std::string> colors = {
      {"params", "#4e79a7"},    {"grads", "#f28e2b"},    {"optimizer", "#e15759"}, {"activations", "#59a14f"},
      {"workspace", "#b07aa1"}, {"comm", "#edc948"},     {"total", "#5b6475"}};
  auto it = colors.find(cat);
  return it == colors.end() ? "#9aa0aa" : it->second;
}

// Peak bytes per category and rank: the maximum over the logged steps (each step's peaks are
// measured from that step's start).
std::vector<std::map<std::string, int64_t>> peak_memory(const RunMetrics& m) {
  std::vector<std::map<std::string, int64_t>> peak;
  for (const auto& r : m.train) {
    if (r.memory.size() > peak.size()) peak.resize(r.memory.size());
    for (size_t k = 0; k < r.memory.size(); ++k)
      for (const auto& [cat, b] : r.memory[k]) peak[k][cat] = std::max(peak[k][cat], b);
  }
  return peak;
}

std::vector<std::string> categories_of(const std::vector<std::map<std::string, int64_t>>& peak) {
  std::vector<std::string> cats = category_order();
  for (const auto& r : peak)
    for (const auto& [cat, b] : r)
      if (cat != "total" && std::find(cats.begin(), cats.end(), cat) == cats.end()) cats.push_back(cat);
  return cats;
}

// One rank: a bar per category (and the total); several: a stacked bar per rank.
std::string render_memory_svg(const std::vector<std::map<std::string, int64_t>>& peak) {
  const std::vector<std::string> cats = categories_of(peak);
  const double left = 150, right = 110, row = 30, top = 8, width = 1200;
  const double pw = width - left - right;
  std::string s;
  if (peak.size() == 1) {
    const auto& r = peak[0];
    std::vector<std::pair<std::string, int64_t>> rows;
    for (const auto& c : cats) rows.emplace_back(c, r.count(c) ? r.at(c) : 0);
    if (r.count("total")) rows.emplace_back("total", r.at("total"));
    int64_t max_b = 1;
    for (const auto& [c, b] : rows) max_b = std::max(max_b, b);
    const double height = top + row * static_cast<double>(rows.size()) + 8;
    s += fmt::format("<svg class=\"bars\" id=\"memory-bars\" viewBox=\"0 0 {:.0f} {:.0f}\" font-size=\"13\">\n",
                     width, height);
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& [cat, b] = rows[i];
      const double y = top + row * static_cast<double>(i);
      const double w = pw * static_cast<double>(b) / static_cast<double>(max_b);
      const bool total = cat == "total";
      if (total)
        s += fmt::format("<line x1=\"{:.0f}\" x2=\"{:.0f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#d5d8de\"/>\n", 10.0,
                         width - 10, y - 1, y - 1);
      s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\"{}>{}</text>", left - 10, y + row / 2 + 4,
                       total ? " font-weight=\"600\"" : "", esc(cat));
      s += fmt::format("<rect class=\"bar\" data-category=\"{}\" x=\"{:.0f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
                       "height=\"{:.0f}\" rx=\"2\" fill=\"{}\"><title>{}: {} ({} bytes)</title></rect>",
                       esc(cat), left, y + 5, std::max(w, b > 0 ? 1.0 : 0.0), row - 10, category_color(cat), esc(cat),
                       format_bytes(static_cast<double>(b)), b);
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#1d2330\">{}</text>\n", left + w + 8, y + row / 2 + 4,
                       format_bytes(static_cast<double>(b)));
    }
    return s + "</svg>\n";
  }
  int64_t max_b = 1;
  for (const auto& r : peak) {
    int64_t sum = 0;
    for (const auto& c : cats) sum += r.count(c) ? r.at(c) : 0;
    max_b = std::max(max_b, sum);
  }
  const double height = top + row * static_cast<double>(peak.size()) + 8;
  s += fmt::format("<svg class=\"bars\" id=\"memory-bars\" viewBox=\"0 0 {:.0f} {:.0f}\" font-size=\"13\">\n", width,
                   height);
  for (size_t k = 0; k < peak.size(); ++k) {
    const double y = top + row * static_cast<double>(k);
    s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">rank {}</text>", left - 10, y + row / 2 + 4, k);
    double x = left;
    int64_t sum = 0;
    for (const auto& c : cats) {
      const int64_t b = peak[k].count(c) ? peak[k].at(c) : 0;
      const double w = pw * static_cast<double>(b) / static_cast<double>(max_b);
      s += fmt::format("<rect class=\"bar\" data-category=\"{}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
                       "height=\"{:.0f}\" fill=\"{}\"><title>rank {} {}: {}</title></rect>",
                       esc(c), x, y + 5, w, row - 10, category_color(c), k, esc(c), format_bytes(static_cast<double>(b)));
      x += w;
      sum += b;
    }
    const int64_t total = peak[k].count("total") ? peak[k].at("total") : sum;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{} peak</text>\n", x + 8, y + row / 2 + 4,
                     format_bytes(static_cast<double>(total)));
  }
  return s + "</svg>\n";
}

// ---- config summary ------------------------------------------------------------------------

// RUN_DIR/config.toml read as tripod reads a config (the resolved file of the run), so the page's
// figures (ranks, micro-batches per pipeline, parameters) are those the run computed.
struct ConfigView {
  std::optional<Config> cfg;
  std::string note;  // why it is missing or unreadable
  std::string text;  // the file
  bool present() const { return cfg.has_value(); }
};

ConfigView read_config(const fs::path& path) {
  ConfigView v;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    v.note = fmt::format("No configuration: {} does not exist (written by tripod train when the run starts).",
                         path.string());
    return v;
  }
  v.text = slurp(path);
  try {
    // Its data files and training keys are not needed to draw the page (the run may have moved).
    v.cfg = parse_config(v.text, path.string(), {}, ConfigUse{.training = false, .data = false});
  } catch (const std::exception& e) {
    v.note = fmt::format("{} is not a config this tripod reads ({}); the summary leaves it out.", path.string(),
                         e.what());
  }
  return v;
}

std::string card(const std::string& key, const std::string& value, const std::string& detail,
                 const std::string& id = "") {
  return fmt::format("<div class=\"card\"{}><div class=\"k\">{}</div><div class=\"v\">{}</div><div class=\"d\">{}</div>"
                     "</div>\n",
                     id.empty() ? "" : fmt::format(" id=\"{}\"", id), esc(key), esc(value), esc(detail));
}

// " · synthetic data", " · data PREFIX (+2 more)" for the page's subtitle.
std::string data_summary(const ConfigView& cv) {
  if (!cv.present()) return "";
  const DataConfig& d = cv.cfg->data;
  if (d.synthetic) return " &middot; synthetic data";
  if (d.prefixes.empty()) return "";
  return " &middot; data " + esc(d.prefixes[0]) +
         (d.prefixes.size() > 1 ? fmt::format(" (+{} more)", d.prefixes.size() - 1) : "");
}

std::string maybe(int64_t v) { return v >= 0 ? std::to_string(v) : "?"; }

// ---- timeline ------------------------------------------------------------------------------

struct Timeline {
  bool present = false;
  std::string note;
  TraceSummary sum;
  std::string svg;
};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

Timeline read_timeline(const fs::path& run_dir) {
  Timeline tl;
  const fs::path dir = run_dir / "trace";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    tl.note = fmt::format("No pipeline timeline: {} does not exist (the run has not started, or ran with "
                          "train.trace = false).",
                          dir.string());
    return tl;
  }
  const std::regex name_re(R"(rank_\d{1,7}\.jsonl)");
  bool any = false;
  for (const auto& e : fs::directory_iterator(dir, ec))
    any |= e.is_regular_file() && std::regex_match(e.path().filename().string(), name_re);
  if (!any) {
    tl.note = fmt::format("No pipeline timeline: {} holds no rank_<R>.jsonl files yet.", dir.string());
    return tl;
  }
  // Read and rendered in memory: RUN_DIR stays untouched (a read-only run works).
  const MergedTrace merged = merge_rank_traces(read_traces(run_dir.string()));
  tl.sum = merged.summary;
  tl.svg = render_gantt_svg(trace_chart(merged));
  // Inline SVG in HTML needs no namespace; without it the page names no URL at all.
  replace_all(tl.svg, " xmlns=\"http://www.w3.org/2000/svg\"", "");
  tl.present = true;
  if (tl.sum.steps == 0) tl.note = "The trace files hold no pipeline step yet.";
  return tl;
}

std::string idle_bar(double f, const char* color) {
  if (f < 0) return "<td class=\"idle\">n/a</td>";
  return fmt::format("<td class=\"idle\"><span class=\"ib\"><i style=\"width:{:.1f}%;background:{}\"></i></span>"
                     "{:.1f}%</td>",
                     std::clamp(100 * f, 0.0, 100.0), color, 100 * f);
}

std::string timeline_html(const Timeline& tl) {
  std::string h = "<section class=\"panel timeline\" id=\"timeline\"><h2>Pipeline timeline</h2>\n";
  if (!tl.present) return h + fmt::format("<p class=\"note\">{}</p></section>\n", esc(tl.note));
  const TraceSummary& s = tl.sum;
  h += fmt::format("<div class=\"panel-sub\">{} schedule, pp={} vp={}, {} micro-batches per pipeline; {} step(s) "
                   "traced, step {} drawn. Idle = 1 &minus; forward/backward time over the step's pipeline window "
                   "(mean over {} step(s){}); ideal = the simulator's bubble for the same schedule with the measured "
                   "mean forward {:.3f} ms and backward {:.3f} ms and free communication.</div>\n",
                   esc(std::string(enum_name(s.kind))), s.pp, s.vp, s.microbatches, s.steps, s.drawn_step, s.steps_used,
                   s.steps > s.steps_used ? ", the first left out" : "", s.mean_forward_us / 1e3,
                   s.mean_backward_us / 1e3);
  if (!tl.note.empty()) h += fmt::format("<p class=\"note\">{}</p>\n", esc(tl.note));
  h += "<div class=\"legend\">"
       "<span><i class=\"box\" style=\"background:linear-gradient(90deg,hsl(0,70%,78%),hsl(137,70%,78%),"
       "hsl(275,70%,78%))\"></i>forward (hue by micro-batch)</span>"
       "<span><i class=\"box\" style=\"background:linear-gradient(90deg,hsl(0,55%,42%),hsl(137,55%,42%),"
       "hsl(275,55%,42%))\"></i>backward</span>"
       "<span><i class=\"box\" style=\"background:#8c8c8c\"></i>send</span>"
       "<span><i class=\"box\" style=\"background:#d0d0d0\"></i>recv</span>"
       "<span><i class=\"box\" style=\"background:#8e6bbf\"></i>reduce (grad sync)</span>"
       "<span><i class=\"box\" style=\"background:#e08a2e\"></i>optimizer</span>";
  // Context parallelism: its axis in the table and its exchanges (bands inside the forward and
  // backward boxes) only when the run used it, as in the grid card.
  const bool cp = s.cp > 1;
  if (cp) h += "<span><i class=\"box\" style=\"background:#1a9e8f\"></i>cp K/V exchange</span>";
  h += "</div>\n";
  h += "<div class=\"trace-svg\">" + tl.svg + "</div>\n";
  h += fmt::format("<table class=\"idle-table\"><thead><tr><th>rank</th><th>pp</th><th>dp</th>{}<th>tp</th>"
                   "<th>events</th><th>measured idle</th><th>ideal idle</th>{}</tr></thead><tbody>\n",
                   cp ? "<th>cp</th>" : "", cp ? "<th>cp exchange per step</th>" : "");
  for (const auto& r : s.ranks)
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td>{}<td>{}</td><td>{}</td>{}{}{}</tr>\n", r.rank,
                     r.coords.pp, r.coords.dp, cp ? fmt::format("<td>{}</td>", r.coords.cp) : "", r.coords.tp,
                     r.events, idle_bar(r.measured_idle, "#d9822b"), idle_bar(r.ideal_idle, "#7a8799"),
                     cp ? fmt::format("<td class=\"cp-exchange\">{:.3f} ms ({:.1f}% of forward/backward)</td>",
                                      r.cp_us_per_step / 1e3, 100 * r.cp_fraction)
                        : "");
  h += "</tbody></table>\n";
  h += "<div class=\"panel-sub\">The full trace opens in Perfetto or chrome://tracing: "
       "<code>tripod trace merge RUN_DIR</code> writes RUN_DIR/trace.json.</div>\n";
  return h + "</section>\n";
}

// ---- the page ------------------------------------------------------------------------------

// The header cards: the grid and config, then where the run stands.
std::string cards_html(const ConfigView& cv, const RunMetrics& m) {
  std::string cards;
  if (cv.present()) {
    const Config& cfg = *cv.cfg;
    const ParallelConfig& p = cfg.parallel;
    // Context parallelism shows as a fourth axis only when the run used it.
    const std::string cp_axis = p.cp > 1 ? fmt::format(" \u00d7 cp {}", p.cp) : std::string();
    const std::string cp_comm =
        p.cp > 1 ? fmt::format("; context parallel over {} ranks ({})", p.cp, enum_name(p.cp_comm)) : std::string();
    cards += card("Grid", fmt::format("dp {} \u00d7 pp {}{} \u00d7 tp {}", p.dp, p.pp, cp_axis, p.tp),
                  fmt::format("{} ranks; vp {}, {} schedule; sequence parallel {}, distributed optimizer {}{}; "
                              "recompute {}",
                              p.tp * p.pp * p.dp * p.cp, p.vp, p.schedule_file.empty() ? enum_name(p.schedule) : "custom",
                              p.sequence_parallel ? "on" : "off", p.distributed_optimizer ? "on" : "off", cp_comm,
                              enum_name(cfg.recompute.mode)),
                  "card-grid");
    const ModelConfig& mc = cfg.model;
    cards += card("Model", format_count(static_cast<double>(mc.num_params(1))) + " parameters",
                  fmt::format("{} layers, d_model {}, {} heads, seq {}, vocab {}", mc.n_layers, mc.d_model, mc.n_heads,
                              mc.seq_len, mc.vocab_size),
                  "card-model");
    const TrainConfig& t = cfg.train;
    cards += card("Batch", fmt::format("{} \u00d7 {} tokens", t.global_batch_size, mc.seq_len),
                  fmt::format("micro-batch {}, {} micro-batches per pipeline; lr {:g} ({}, warm-up {})",
                              t.micro_batch_size, microbatches_per_rank(cfg), t.lr, enum_name(t.decay), t.warmup_steps),
                  "card-batch");
  }
  if (!m.train.empty()) {
    const StepRecord& last = m.train.back();
    double elapsed = 0;
    for (const auto& r : m.train)
      if (std::isfinite(r.step_time_s)) elapsed += r.step_time_s;
    const int64_t steps = cv.present() ? cv.cfg->train.steps : -1;
    cards += card("Progress", fmt::format("step {} / {}", last.step, maybe(steps)),
                  fmt::format("{} logged step(s), {} logged step time{}", m.train.size(),
                              elapsed < 60 ? fmt::format("{:.3g} s", elapsed) : format_duration(elapsed),
                              last.consumed_samples >= 0 ? fmt::format(", {} samples", last.consumed_samples) : ""),
                  "card-progress");
    double lo = INFINITY;
    int64_t skipped = 0;
    for (const auto& r : m.train) {
      if (std::isfinite(r.loss)) lo = std::min(lo, r.loss);
      skipped += r.skipped;
    }
    cards += card("Train loss", std::isfinite(last.loss) ? fmt::format("{:.4f}", last.loss) : "n/a",
                  fmt::format("at step {}; lowest {}{}", last.step, std::isfinite(lo) ? fmt::format("{:.4f}", lo) : "n/a",
                              skipped ? fmt::format("; {} skipped update(s)", skipped) : ""),
                  "card-loss");
    // Throughput without the first step, which pays for warm-up, when there are others.
    std::vector<double> tps, mfu, st;
    for (size_t k = m.train.size() > 1 ? 1 : 0; k < m.train.size(); ++k) {
      tps.push_back(m.train[k].tokens_per_s);
      mfu.push_back(m.train[k].mfu);
      st.push_back(m.train[k].step_time_s);
    }
    const double tps_med = median(tps), mfu_med = median(mfu), st_med = median(st);
    cards += card("Throughput", std::isfinite(tps_med) ? format_si(tps_med) + " tokens/s" : "n/a",
                  fmt::format("median{}; step time {}", m.train.size() > 1 ? " after the first step" : "",
                              std::isfinite(st_med) ? fmt::format("{:.3g} s", st_med) : "n/a"),
                  "card-throughput");
    cards += card("MFU", std::isfinite(mfu_med) ? fmt::format("{:.2f}%", 100 * mfu_med) : "n/a",
                  fmt::format("median; device {}", cv.present() ? std::string(enum_name(cv.cfg->train.device)) : "?"),
                  "card-mfu");
  }
  if (!m.eval.empty()) {
    const EvalRecord* best = nullptr;
    for (const auto& e : m.eval)
      if (std::isfinite(e.loss) && (!best || e.loss < best->loss)) best = &e;
    if (best)
      cards += card("Validation loss", fmt::format("{:.4f}", best->loss),
                    fmt::format("lowest, {} split at step {}{}", best->split, best->step,
                                std::isfinite(best->perplexity) ? fmt::format("; perplexity {:.2f}", best->perplexity)
                                                                : ""),
                    "card-eval");
  }

  return cards;
}

struct Columns {
  std::vector<double> step, loss, lr, gn, tps, mfu;
  std::vector<int64_t> flagged;  // skipped steps
};

Columns columns(const RunMetrics& m) {
  Columns c;
  for (const auto& r : m.train) {
    c.step.push_back(static_cast<double>(r.step));
    c.loss.push_back(r.loss);
    c.lr.push_back(r.lr);
    c.gn.push_back(r.grad_norm);
    c.tps.push_back(r.tokens_per_s);
    c.mfu.push_back(r.mfu);
    if (r.skipped) c.flagged.push_back(r.step);
  }
  return c;
}

// Training loss (smoothed too when long) and each split's evaluation loss.
std::string loss_panel(const RunMetrics& m, bool has_metrics, json& charts) {
  if (m.train.empty() && m.eval.empty())
    return "<section class=\"panel\" id=\"panel-loss\"><h2>Loss, throughput and MFU</h2><p class=\"note\">" +
           esc(has_metrics ? "No metrics yet: metrics.jsonl holds no step records."
                           : "No metrics yet: metrics.jsonl does not exist (rank 0 writes it at the first "
                             "logged step).") +
           "</p></section>\n";
  const Columns c = columns(m);
  LineChart lc = make_chart("loss", ValueFormat::Plain, false, "loss (nats/token)", 1200, 340);
  lc.flagged = c.flagged;
  if (!m.train.empty()) {
    const bool smoothed = m.train.size() >= 30;
    lc.series.push_back(Series{.name = "train", .color = smoothed ? "#6baed6" : "#1f77b4", .x = c.step, .y = c.loss,
                               .opacity = smoothed ? 0.45 : 1.0, .width = smoothed ? 1.2 : 2.0});
    if (smoothed)
      lc.series.push_back(Series{.name = "train (smoothed)", .color = "#08519c", .x = c.step, .y = smooth(c.loss),
                                 .trend = true, .width = 2.2});
  }
  const std::vector<std::string> eval_colors = {"#e6550d", "#31a354", "#756bb1", "#d6616b"};
  std::map<std::string, Series> splits;
  for (const auto& e : m.eval) {
    auto [it, fresh] = splits.try_emplace(e.split);
    Series& s = it->second;
    if (fresh) {
      s.name = e.split == "valid" || e.split == "validation" ? "validation" : e.split;
      s.color = eval_colors[(splits.size() - 1) % eval_colors.size()];
      s.markers = true;
      s.width = 2.2;
    }
    s.x.push_back(static_cast<double>(e.step));
    s.y.push_back(e.loss);
  }
  for (auto& [name, s] : splits) lc.series.push_back(std::move(s));
  return chart_panel("Loss", m.eval.empty() ? "training loss per logged step (the global batch's mean)"
                                            : "training loss per logged step; evaluation loss at each eval",
                     lc, charts);
}

// Downstream tasks over the steps: the multiple-choice tasks' accuracy (acc_norm, and acc
// fainter), and bits per byte beside it when a text task ran.
std::string tasks_panel(const RunMetrics& m, json& charts) {
  if (m.tasks.empty()) return "";
  const std::vector<std::string> colors = {"#1f77b4", "#e6550d", "#31a354", "#756bb1", "#d6616b", "#8c6d31"};
  LineChart acc = make_chart("tasks-acc", ValueFormat::Percent, true, "accuracy", 600, 260);
  LineChart bpb = make_chart("tasks-bpb", ValueFormat::Plain, false, "bits per byte", 600, 260);
  std::map<std::string, size_t> series;  // "task metric" -> index in its chart
  std::map<std::string, size_t> color_of;
  for (const TaskRecord& t : m.tasks) {
    const std::string color = colors[color_of.try_emplace(t.task, color_of.size()).first->second % colors.size()];
    for (const TaskMetric& tm : t.metrics) {
      const std::string& metric = tm.name;
      const double value = tm.value;
      const bool accuracy = metric == "acc" || metric == "acc_norm";
      if (!accuracy && metric != "bits_per_byte") continue;
      LineChart& c = accuracy ? acc : bpb;
      const std::string name = metric == "bits_per_byte" ? t.task : t.task + " " + metric;
      auto [it, fresh] = series.try_emplace(name, c.series.size());
      if (fresh)
        c.series.push_back(Series{.name = name, .color = color, .x = {}, .y = {}, .markers = true,
                                  .opacity = metric == "acc" ? 0.5 : 1.0, .width = metric == "acc" ? 1.2 : 2.2});
      c.series[it->second].x.push_back(static_cast<double>(t.step));
      c.series[it->second].y.push_back(value);
    }
  }
  std::string h = acc.series.empty() || bpb.series.empty() ? "" : "<div class=\"grid2\">\n";
  if (!acc.series.empty())
    h += chart_panel("Downstream accuracy", "multiple-choice tasks at each evaluation: acc_norm (bold) and acc "
                     "(length-normalized and raw log-likelihood, as lm-evaluation-harness scores them)", acc, charts);
  if (!bpb.series.empty())
    h += chart_panel("Bits per byte", "text tasks at each evaluation (comparable across tokenizers)", bpb, charts);
  return h + (acc.series.empty() || bpb.series.empty() ? "" : "</div>\n");
}

// Throughput and MFU side by side.
std::string performance_panels(const RunMetrics& m, json& charts) {
  if (m.train.empty()) return "";
  const Columns c = columns(m);
  std::string h = "<div class=\"grid2\">\n";
  LineChart t = make_chart("throughput", ValueFormat::Si, true, "tokens/s", 600, 250);
  t.series.push_back(Series{.name = "tokens/s", .color = "#2a9d8f", .x = c.step, .y = c.tps});
  h += chart_panel("Throughput", "tokens per second of the whole run, per step", t, charts);
  LineChart u = make_chart("mfu", ValueFormat::Percent, true, "MFU", 600, 250);
  u.series.push_back(Series{.name = "MFU", .color = "#c2410c", .x = c.step, .y = c.mfu});
  h += chart_panel("Model FLOPs utilisation", "model FLOPs per second over the devices' peak", u, charts);
  return h + "</div>\n";
}

// Learning rate and gradient norm side by side.
std::string optimizer_panels(const RunMetrics& m, json& charts) {
  if (m.train.empty()) return "";
  const Columns c = columns(m);
  std::string h = "<div class=\"grid2\">\n";
  LineChart l = make_chart("lr", ValueFormat::Sci, true, "learning rate", 600, 230);
  l.series.push_back(Series{.name = "lr", .color = "#6d28d9", .x = c.step, .y = c.lr});
  h += chart_panel("Learning rate", "", l, charts);
  LineChart g = make_chart("grad_norm", ValueFormat::Plain, true, "grad norm", 600, 230);
  g.flagged = c.flagged;
  g.series.push_back(Series{.name = "grad norm", .color = "#475569", .x = c.step, .y = c.gn});
  h += chart_panel("Gradient norm", "before clipping", g, charts);
  return h + "</div>\n";
}

// Peak bytes per category: rank 0's, or every rank's when the records hold them all.
std::string memory_panel(const RunMetrics& m) {
  std::string memory = "<section class=\"panel\" id=\"memory\"><h2>Peak memory by category</h2>\n";
  const auto peak = peak_memory(m);
  if (peak.empty()) return memory + "<p class=\"note\">No memory figures: no metrics record holds mem_peak_bytes.</p>\n</section>\n";
  memory += fmt::format("<div class=\"panel-sub\">{}; the highest over the logged steps. Total is the peak of the sum, "
                        "which can be less than the sum of the categories' peaks.</div>\n",
                        peak.size() == 1 ? "bytes held by world rank 0 (the rank that writes metrics.jsonl)"
                                         : fmt::format("bytes held by each of the {} ranks", peak.size()));
  if (peak.size() > 1) {
    memory += "<div class=\"legend\">";
    for (const auto& c : categories_of(peak))
      memory += fmt::format("<span><i class=\"box\" style=\"background:{}\"></i>{}</span>", category_color(c), esc(c));
    memory += "</div>\n";
  }
  return memory + render_memory_svg(peak) + "</section>\n";
}

// The expert-load heat map of one MoE layer: a column per step (the logged steps binned into at
// most kMaxColumns columns, each the mean of its steps), a row per expert, each cell its share of
// the step's pairs over the mean share (1 = balanced): blue below, white at 1, red above (2x and
// more at full red). Hover: the steps, the expert, the ratio.
std::string expert_load_svg(const std::vector<int64_t>& steps, const std::vector<std::vector<double>>& loads,
                            int layer) {
  constexpr size_t kMaxColumns = 240;
  const size_t n = loads.size(), E = loads.front().size();
  const size_t cols = std::min(n, kMaxColumns);
  const double left = 70, top = 6, right = 10, width = 1200, cell_h = std::clamp(160.0 / E, 4.0, 18.0);
  const double cw = (width - left - right) / static_cast<double>(cols), height = top + cell_h * E + 22;
  std::string s = fmt::format("<svg class=\"heatmap\" id=\"expert-load-{}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
                              "font-size=\"11\">\n",
                              layer, width, height);
  auto color = [](double ratio) {  // ratio 0..1: blue to white; 1..2: white to red
    const double t = std::clamp(ratio < 1 ? 1 - ratio : (ratio - 1), 0.0, 1.0);
    const int fade = static_cast<int>(std::lround(255 * (1 - t)));
    return ratio < 1 ? fmt::format("rgb({},{},255)", fade, fade) : fmt::format("rgb(255,{},{})", fade, fade);
  };
  for (size_t e = 0; e < E; ++e)
    if (E <= 16 || e % ((E + 15) / 16) == 0)
      s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">expert {}</text>", left - 6,
                       top + cell_h * (static_cast<double>(e) + 0.5) + 4, e);
  for (size_t c = 0; c < cols; ++c) {
    const size_t b = c * n / cols, end = (c + 1) * n / cols;
    std::vector<double> share(E, 0.0);
    for (size_t i = b; i < end; ++i) {
      double total = 0;
      for (double v : loads[i]) total += v;
      if (total > 0)
        for (size_t e = 0; e < E; ++e) share[e] += loads[i][e] * static_cast<double>(E) / total;
    }
    const std::string when = end - b > 1 ? fmt::format("steps {}-{}", steps[b], steps[end - 1])
                                         : fmt::format("step {}", steps[b]);
    for (size_t e = 0; e < E; ++e) {
      const double ratio = share[e] / static_cast<double>(end - b);
      s += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\"><title>layer {} "
                       "{}, expert {}: {:.2f}x the mean load</title></rect>",
                       left + cw * static_cast<double>(c), top + cell_h * static_cast<double>(e), cw + 0.3, cell_h,
                       color(ratio), layer, when, e, ratio);
    }
    s += "\n";
  }
  const double y = top + cell_h * E + 16;
  s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\">step {}</text><text x=\"{:.0f}\" y=\"{:.1f}\" "
                   "text-anchor=\"end\">step {}</text>\n",
                   left, y, steps.front(), width - right, y, steps.back());
  return s + "</svg>\n";
}

// Mixture of experts: per MoE layer the heat map of expert load over the logged steps, and the
// last step's worst max/mean load and dropped pairs. Nothing for a dense run.
std::string expert_load_panel(const RunMetrics& m) {
  std::map<int, std::pair<std::vector<int64_t>, std::vector<std::vector<double>>>> by_layer;
  std::map<int, double> dropped;
  for (const StepRecord& r : m.train)
    for (const MoeLayerRecord& l : r.moe) {
      if (l.tokens_per_expert.empty()) continue;
      auto& [steps, loads] = by_layer[l.layer];
      if (!loads.empty() && loads.front().size() != l.tokens_per_expert.size()) continue;  // another model
      steps.push_back(r.step);
      loads.push_back(l.tokens_per_expert);
      dropped[l.layer] += l.dropped;
    }
  if (by_layer.empty()) return "";
  std::string h = "<section class=\"panel\" id=\"expert-load\"><h2>Expert load</h2>\n";
  h += "<div class=\"panel-sub\">Per MoE layer, each expert's share of the step's (token, choice) pairs over the "
       "mean share, step by step (wide runs binned): <span style=\"color:#3050d0\">blue</span> below the mean, "
       "white at it, <span style=\"color:#d03030\">red</span> above (full red at 2x). A balanced router is white.</div>\n";
  for (const auto& [layer, data] : by_layer) {
    const auto& [steps, loads] = data;
    double top = 0, sum = 0;
    for (double v : loads.back()) top = std::max(top, v), sum += v;
    const double ratio = sum > 0 ? top * static_cast<double>(loads.back().size()) / sum : 0;
    h += fmt::format("<h3>layer {}: {} experts; last step max/mean load {:.2f}; dropped pairs over the logged steps "
                     "{}</h3>\n",
                     layer, loads.back().size(), ratio, format_count(dropped[layer]));
    h += expert_load_svg(steps, loads, layer);
  }
  return h + "</section>\n";
}

// Stragglers: the slowest rank's compute time over the median per log interval, against the
// bar, and a table of the ranks named.
std::string straggler_panel(const RunMetrics& m, const ConfigView& cfg, json& charts) {
  std::vector<double> x, ratio;
  struct Named {
    int64_t first = 0, last = 0, records = 0;
    double worst = 0;
  };
  std::map<int, Named> named;
  for (const auto& r : m.train) {
    if (!r.stragglers) continue;
    const StragglerSummary& s = *r.stragglers;
    if (std::isfinite(s.median_compute_s) && s.median_compute_s > 0) {
      x.push_back(static_cast<double>(r.step));
      ratio.push_back(s.max_compute_s / s.median_compute_s);
    }
    for (const auto& g : s.stragglers) {
      auto [it, fresh] = named.try_emplace(g.rank, Named{r.step, r.step, 0, 0});
      it->second.last = r.step;
      ++it->second.records;
      it->second.worst = std::max(it->second.worst, g.ratio);
    }
  }
  if (x.empty()) return "";  // one rank, or straggler detection off
  const double bar = cfg.present() && cfg.cfg->train.straggler_factor > 0 ? cfg.cfg->train.straggler_factor : kNaN;
  std::string h = "<section class=\"panel\" id=\"stragglers\"><h2>Stragglers</h2>\n";
  h += fmt::format("<div class=\"panel-sub\">compute time per step (forward and backward work) of the slowest rank over "
                   "the median of all ranks, per log interval; a rank over {} for 3 intervals in a row is named</div>\n",
                   std::isfinite(bar) ? fmt::format("{:g}\u00d7", bar) : "train.straggler_factor");
  if (named.empty()) {
    h += "<p>No straggler: no rank stayed over the bar.</p>\n";
  } else {
    h += "<table class=\"stragglers\"><tr><th>rank</th><th>named at steps</th><th>logged intervals</th>"
         "<th>worst compute / median</th></tr>\n";
    for (const auto& [rank, n] : named)
      h += fmt::format("<tr><td>rank {}</td><td>{} \u2013 {}</td><td>{}</td><td>{:.2f}\u00d7</td></tr>\n", rank, n.first,
                       n.last, n.records, n.worst);
    h += "</table>\n";
  }
  LineChart c = make_chart("straggler_ratio", ValueFormat::Plain, true, "slowest / median compute", 1200, 220);
  c.series.push_back(Series{.name = "slowest rank / median", .color = "#b91c1c", .x = x, .y = ratio});
  if (std::isfinite(bar))
    c.series.push_back(Series{.name = "bar", .color = "#94a3b8", .x = {x.front(), x.back()}, .y = {bar, bar},
                              .width = 1.2, .hover = false});
  h += legend_html(c.series, false) + render_line_chart(c, charts);
  h += fmt::format("<div class=\"readout\" id=\"readout-{0}\" data-hint=\"{1}\">{1}</div>", c.id,
                   "hover over the chart for values");
  return h + "</section>\n";
}

// FP8 (train.precision = "fp8"): each layer's scales over the steps (log2, the smallest of its
// linears' per operand: x, w, dy) and, per linear, the values clipped over the logged steps.
std::string fp8_panel(const RunMetrics& m, json& charts) {
  std::map<int, int> layer_index;  // layer -> series index
  std::map<std::string, std::array<double, 3>> clipped;
  std::map<std::string, const Fp8LinearRecord*> last;
  for (const auto& r : m.train)
    for (const auto& [name, f] : r.fp8) {
      int layer = -1;
      if (std::sscanf(name.c_str(), "h.%d.", &layer) == 1 && layer >= 0) layer_index.try_emplace(layer, 0);
      auto& c = clipped[name];
      for (int o = 0; o < 3; ++o) c[o] += std::isfinite(f.saturated[o]) ? f.saturated[o] : 0;
      last[name] = &f;
    }
  if (clipped.empty()) return "";
  const std::vector<std::string> colors = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                                           "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  std::string h = "<section class=\"panel\" id=\"fp8\"><h2>FP8 scales and saturation</h2>\n";
  h += "<div class=\"panel-sub\">log2 of each layer's scale per logged step (the smallest of its FP8 linears': "
       "q = fp8(x \u00b7 scale)), for the inputs and weights (e4m3) and the output gradients (e5m2)</div>\n";
  const char* operands[3] = {"inputs x", "weights w", "output gradients dy"};
  std::string grid;
  std::vector<Series> legend;
  for (int o = 0; o < 3; ++o) {
    LineChart c = make_chart(fmt::format("fp8_scale_{}", o), ValueFormat::Plain, false, "log2 scale", 400, 240);
    for (const auto& [layer, unused] : layer_index) {
      Series s;
      s.name = fmt::format("layer {}", layer);
      s.color = colors[layer % colors.size()];
      const std::string prefix = fmt::format("h.{}.", layer);
      for (const auto& r : m.train) {
        double lo = kNaN;
        for (const auto& [name, f] : r.fp8)
          if (name.rfind(prefix, 0) == 0 && f.scale[o] > 0 && !(f.scale[o] >= lo)) lo = f.scale[o];
        if (!std::isfinite(lo)) continue;
        s.x.push_back(static_cast<double>(r.step));
        s.y.push_back(std::log2(lo));
      }
      if (!s.x.empty()) c.series.push_back(std::move(s));
    }
    if (legend.size() < c.series.size()) legend = c.series;
    grid += "<div><h3>" + std::string(operands[o]) + "</h3>" + render_line_chart(c, charts) +
            fmt::format("<div class=\"readout\" id=\"readout-{0}\" data-hint=\"{1}\">{1}</div></div>\n", c.id,
                        "hover over the chart for values");
  }
  h += legend_html(legend, false) + "<div class=\"grid3\">\n" + grid + "</div>\n";
  double total = 0;
  for (const auto& [name, c] : clipped) total += c[0] + c[1] + c[2];
  h += fmt::format("<details{}><summary>values clipped to the largest FP8 value: {:.0f} over the logged steps"
                   "</summary>\n<table class=\"fp8\"><tr><th>linear</th><th>x</th><th>w</th><th>dy</th>"
                   "<th>last scales x, w, dy</th><th>last amax of y</th></tr>\n",
                   total > 0 ? " open" : "", total);
  for (const auto& [name, c] : clipped) {
    const Fp8LinearRecord& f = *last[name];
    h += fmt::format("<tr><td>{}</td><td>{:.0f}</td><td>{:.0f}</td><td>{:.0f}</td><td>{:.4g}, {:.4g}, {:.4g}</td>"
                     "<td>{:.4g}</td></tr>\n",
                     esc(name), c[0], c[1], c[2], f.scale[0], f.scale[1], f.scale[2], f.amax[3]);
  }
  return h + "</table></details>\n</section>\n";
}

std::string config_panel(const ConfigView& cfg) {
  if (cfg.text.empty()) return "";
  return "<section class=\"panel\" id=\"config\"><details><summary>config.toml (resolved)</summary><pre>" +
         esc(cfg.text) + "</pre></details></section>\n";
}

std::string notes_html(const std::vector<std::string>& notes) {
  if (notes.empty()) return "";
  std::string h = "<div class=\"notes\" id=\"notes\">";
  for (const auto& n : notes) h += "<p class=\"note\">" + esc(n) + "</p>";
  return h + "</div>\n";
}

std::string now_string() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&t));
  return buf;
}

}  // namespace

namespace {

std::string restarts_panel(const std::vector<RestartRecord>& rs) {
  if (rs.empty()) return "";
  double lost = 0;
  for (const auto& r : rs) lost += r.time_lost_s;
  std::string h = fmt::format(
      "<section class=\"panel\" id=\"restarts\"><h2>Restarts</h2>\n<div class=\"panel-sub\">{} automatic "
      "restart(s) by the launcher (--max-restarts), {:.1f} s lost in all: from the end of the work kept (the "
      "checkpoint resumed from) to the restarted run's first step</div>\n",
      rs.size(), lost);
  h += "<table class=\"idle-table\"><thead><tr><th>restart</th><th>failed at (UTC)</th><th>cause</th><th>exit "
       "status</th><th>resumed from step</th><th>time lost</th><th>downtime</th></tr></thead><tbody>\n";
  for (const auto& r : rs) {
    char when[32] = "?";
    const time_t t = static_cast<time_t>(r.failed_at);
    std::tm tm{};
    if (r.failed_at > 0 && gmtime_r(&t, &tm)) std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1f} s</td><td>{:.1f} "
                     "s</td></tr>\n",
                     r.attempt, when, esc(r.cause), r.exit_status, r.resumed_from_step, r.time_lost_s, r.downtime_s);
  }
  return h + "</tbody></table></section>\n";
}

// The planner's prediction against the run's profiled steps (RUN_DIR/plan_check.json, written with
// train.profile_steps; plan/plan_check.h): per family and for the step.
std::string plan_check_panel(const fs::path& run_dir) {
  std::error_code ec;
  if (!fs::exists(run_dir / kPlanCheckFile, ec)) return "";
  const PlanCheck c = read_plan_check(run_dir.string());
  const double step = c.measured.step;
  std::string h = fmt::format(
      "<section class=\"panel\" id=\"plan-check\"><h2>Planner check</h2>\n<div class=\"panel-sub\">steps {}-{} "
      "measured (each rank's median, mean over {} rank(s)) against tripod plan's prediction for this layout and "
      "schedule on {}; error: predicted / measured - 1, in parentheses for a family under {:.0f}% of the step (its "
      "difference as a share of the step)</div>\n",
      c.steps.front(), c.steps.back(), c.measured_ranks.size(), esc(c.hardware), 100 * kSmallShare);
  h += "<table class=\"idle-table\"><thead><tr><th></th><th>predicted</th><th>measured</th><th>error</th><th>of "
       "step</th></tr></thead><tbody>\n";
  auto row = [&](std::string name, double p, double m) {
    std::string error = "&ndash;";
    if (step > 0 && m >= kSmallShare * step) error = fmt::format("{:+.1f}%", 100 * (p / m - 1));
    else if (step > 0) error = fmt::format("({:+.1f}%)", 100 * (p - m) / step);
    h += fmt::format("<tr><td>{}</td><td>{:.3f} ms</td><td>{:.3f} ms</td><td>{}</td><td>{:.1f}%</td></tr>\n", name,
                     1e3 * p, 1e3 * m, error, step > 0 ? 100 * m / step : 0.0);
  };
  for (int i = 0; i < StepBreakdown::kParts; ++i) {
    std::string name(StepBreakdown::part_name(i));
    std::replace(name.begin(), name.end(), '_', ' ');
    row(name, c.predicted.part(i), c.measured.part(i));
  }
  row("<b>step</b>", c.predicted.step, c.measured.step);
  return h + "</tbody></table></section>\n";
}

}  // namespace

std::string render_report(const std::string& run_dir_arg, ReportInfo* info_out) {
  const fs::path run_dir(run_dir_arg);
  std::error_code ec;
  TRIPOD_INPUT_CHECK(fs::exists(run_dir, ec), "{}: no such run directory (give train.output_dir of a run)",
                     run_dir_arg);
  TRIPOD_INPUT_CHECK(fs::is_directory(run_dir, ec), "{}: not a directory (give train.output_dir of a run)",
                     run_dir_arg);
  ReportInfo info;
  const ConfigView cfg = read_config(run_dir / "config.toml");
  info.has_config = cfg.present();
  if (!cfg.note.empty()) info.notes.push_back(cfg.note);

  RunMetrics m;
  const fs::path metrics_path = run_dir / "metrics.jsonl";
  info.has_metrics = fs::exists(metrics_path, ec);
  if (info.has_metrics) m = read_metrics(metrics_path.string());
  else info.notes.push_back(fmt::format("No metrics yet: {} does not exist (rank 0 writes it at the first logged step).",
                                        metrics_path.string()));
  if (info.has_metrics && m.train.empty() && m.eval.empty())
    info.notes.push_back(fmt::format("No metrics yet: {} holds no step records.", metrics_path.string()));
  info.train_steps = static_cast<int64_t>(m.train.size());
  info.eval_points = static_cast<int64_t>(m.eval.size());

  std::vector<RestartRecord> restarts;
  if (fs::exists(run_dir / "restarts.jsonl", ec)) restarts = read_restarts((run_dir / "restarts.jsonl").string());
  info.restarts = static_cast<int64_t>(restarts.size());

  const Timeline tl = read_timeline(run_dir);
  info.has_trace = tl.present;
  if (!tl.note.empty()) info.notes.push_back(tl.note);

  // The page's sections, most looked-at first: curves, throughput, timeline, memory, optimizer.
  json js;
  js["charts"] = json::object();
  json& charts = js["charts"];
  const std::string cards = cards_html(cfg, m);
  std::string body = loss_panel(m, info.has_metrics, charts);
  body += tasks_panel(m, charts);
  body += restarts_panel(restarts);
  body += performance_panels(m, charts);
  body += plan_check_panel(run_dir);
  body += straggler_panel(m, cfg, charts);
  body += fp8_panel(m, charts);
  body += expert_load_panel(m);
  body += timeline_html(tl) + memory_panel(m) + optimizer_panels(m, charts) + config_panel(cfg);
  if (m.unfinished_line)
    info.notes.push_back(fmt::format("The last line of {} is unfinished (being written?) and was left out.",
                                     metrics_path.string()));
  if (m.superseded || m.other_records)
    info.notes.push_back(fmt::format("metrics.jsonl: {} record(s) replaced by a later record of the same step (a "
                                     "resumed run){}.",
                                     m.superseded,
                                     m.other_records ? fmt::format("; {} record(s) of other kinds left out",
                                                                   m.other_records)
                                                     : ""));

  const std::string notes = notes_html(info.notes);

  std::string data = js.dump();
  replace_all(data, "</", "<\\/");  // the JSON sits inside a <script> element
  std::string title = fmt::format("tripod report: {}", fs::absolute(run_dir).lexically_normal().string());
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{}</style>\n"
      "</head>\n<body>\n<main>\n<header><h1>tripod run report</h1><div class=\"sub\">{} &middot; generated {} by tripod "
      "{}{}</div></header>\n<div class=\"cards\">\n{}</div>\n{}{}"
      "<footer>Self-contained page: everything is inline, nothing is fetched. Values appear on hover.</footer>\n"
      "</main>\n<script type=\"application/json\" id=\"report-data\">{}</script>\n<script>{}</script>\n</body>\n</html>\n",
      esc(title), report_assets::kCss, esc(fs::absolute(run_dir).lexically_normal().string()), now_string(), TRIPOD_VERSION,
      data_summary(cfg),
      cards, notes, body, data, report_assets::kJs);
  if (info_out) *info_out = info;
  return html;
}

ReportInfo write_report(const std::string& run_dir, const std::string& out) {
  ReportInfo info;
  std::string html = render_report(run_dir, &info);
  info.path = out.empty() ? (fs::path(run_dir) / "report.html").string() : out;
  // Written beside the target and renamed over it: a reader never sees half a page.
  std::error_code ec;
  const fs::path parent = fs::absolute(info.path).parent_path();
  TRIPOD_INPUT_CHECK(fs::is_directory(parent, ec), "{}: cannot write the report: {} is not a folder", info.path,
                     parent.string());
  TRIPOD_INPUT_CHECK(!fs::is_directory(info.path, ec), "{}: is a folder; --out names the report's file", info.path);
  const std::string tmp = info.path + ".tmp" + std::to_string(::getpid());
  try {
    write_text_file(tmp, html);
  } catch (const InputError&) {
    fs::remove(tmp, ec);
    throw InputError(fmt::format("{}: cannot write the report ({})", info.path, std::strerror(errno)));
  }
  fs::rename(tmp, info.path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    throw InputError(fmt::format("{}: cannot write the report ({})", info.path, why));
  }
  return info;
}

}  // namespace tripod
