// The merge of the ranks' trace files into one Chrome trace and one SVG Gantt chart with measured
// and ideal idle fractions.
#include "report/trace_merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "parallel/pipeline/simulate.h"

namespace tripod {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Reads one rank's file, keeping its last session.
RankTrace read_rank_trace(const fs::path& path) {
  std::ifstream in(path);
  TRIPOD_INPUT_CHECK(in.good(), "{}: cannot read ({})", path.string(), std::strerror(errno));
  RankTrace t;
  t.path = path.string();
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw InputError(fmt::format("{}:{}: not a JSON trace line ({})", t.path, line_no, e.what()));
    }
    try {
      if (j.contains("tripod_trace")) {
        t.header = j;
        t.events.clear();
        (void)j.at("rank").get<int>();
        (void)j.at("world").get<int>();
        (void)j.at("schedule").at("kind").get<std::string>();
        continue;
      }
      TRIPOD_INPUT_CHECK(!t.header.is_null(), "{}:{}: trace event before the header line", t.path, line_no);
      t.events.push_back({j.at("step").get<int64_t>(), j.at("name").get<std::string>(), j.at("cat").get<std::string>(),
                          j.at("mb").get<int>(), j.at("chunk").get<int>(), j.at("ts").get<double>(),
                          j.at("dur").get<double>()});
    } catch (const json::exception& e) {
      throw InputError(fmt::format("{}:{}: not a tripod trace line ({})", t.path, line_no, e.what()));
    }
  }
  TRIPOD_INPUT_CHECK(!t.header.is_null(), "{}: no header line (not a tripod trace file)", t.path);
  return t;
}

bool is_compute(const std::string& cat) { return cat == "forward" || cat == "backward"; }

std::string category_fill(const TraceEvent& e) {
  if (is_compute(e.cat)) {
    if (auto a = parse_action(e.name)) return action_fill(*a);
    return e.cat == "forward" ? "#9ecae1" : "#3182bd";
  }
  if (e.cat == "send") return "#8c8c8c";
  if (e.cat == "recv") return "#d0d0d0";
  if (e.cat == "reduce") return "#8e6bbf";
  if (e.cat == "optimizer") return "#e08a2e";
  if (e.cat == "cp") return "#1a9e8f";
  return "#bbbbbb";
}

bool is_cp(const std::string& cat) { return cat == "cp"; }

}  // namespace

std::map<int, RankTrace> read_traces(const std::string& run_dir) {
  std::error_code ec;
  TRIPOD_INPUT_CHECK(fs::is_directory(run_dir, ec), "{}: no such run directory", run_dir);
  const fs::path dir = fs::path(run_dir) / "trace";
  TRIPOD_INPUT_CHECK(fs::is_directory(dir, ec),
                     "{}: no trace folder (the run wrote no trace; rank files go to RUN_DIR/trace/rank_<R>.jsonl)",
                     dir.string());
  const std::regex name_re(R"(rank_(\d{1,7})\.jsonl)");
  std::map<int, RankTrace> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !std::regex_match(name, m, name_re)) continue;
    files[std::stoi(m[1].str())] = read_rank_trace(entry.path());
  }
  TRIPOD_INPUT_CHECK(!ec, "{}: cannot list ({})", dir.string(), ec.message());
  TRIPOD_INPUT_CHECK(!files.empty(), "{}: no rank_<R>.jsonl trace files", dir.string());
  return files;
}

MergedTrace merge_rank_traces(const std::map<int, RankTrace>& files) {
  TRIPOD_CHECK(!files.empty(), "merge_rank_traces: no trace files");
  // The latest session decides the world; files of ranks beyond it are left from older runs.
  const RankTrace* latest = nullptr;
  for (const auto& [r, t] : files)
    if (!latest || t.header.value("origin_unix_us", int64_t{0}) > latest->header.value("origin_unix_us", int64_t{0}))
      latest = &t;
  const int world = latest->header.at("world").get<int>();
  std::vector<const RankTrace*> ranks;
  for (const auto& [r, t] : files) {
    if (r >= world) continue;
    TRIPOD_INPUT_CHECK(t.header.at("rank").get<int>() == r && t.header.at("world").get<int>() == world,
                       "{}: header says rank {} of {}, expected rank {} of {}", t.path, t.header.at("rank").get<int>(),
                       t.header.at("world").get<int>(), r, world);
    ranks.push_back(&t);
  }

  // The schedule, rebuilt from the headers (each holds its pipeline rank's actions).
  MergedTrace merged;
  TraceSummary& sum = merged.summary;
  const json& sh = latest->header.at("schedule");
  Schedule sched;
  try {
    const std::string kind = sh.at("kind").get<std::string>();
    const std::optional<ScheduleKind> k = parse_enum<ScheduleKind>(kind);
    TRIPOD_INPUT_CHECK(k.has_value(), "{}: schedule kind '{}' in the header is unknown", latest->path, kind);
    sched.kind = *k;
    sched.pp = sh.at("pp").get<int>();
    sched.vp = sh.at("vp").get<int>();
    sched.microbatches = sh.at("microbatches").get<int>();
    const std::string placement = sh.value("placement", "loop");
    auto p = parse_placement(placement);
    TRIPOD_INPUT_CHECK(p.has_value(), "{}: placement '{}' in the header is unknown (valid: loop, v)", latest->path,
                       placement);
    sched.placement = *p;
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: bad schedule in the header ({})", latest->path, e.what()));
  }
  sum.kind = sched.kind;
  sum.pp = sched.pp;
  sum.vp = sched.vp;
  sum.microbatches = sched.microbatches;
  TRIPOD_INPUT_CHECK(sched.pp >= 1 && sched.pp <= world, "{}: schedule pp = {} does not fit a world of {} ranks",
                     latest->path, sched.pp, world);
  sched.ranks.assign(sched.pp, {});
  std::vector<char> have(sched.pp, 0);
  for (const RankTrace* t : ranks) {
    const json& s = t->header.at("schedule");
    TRIPOD_INPUT_CHECK(s.value("kind", "") == enum_name(sum.kind) && s.value("pp", 0) == sched.pp &&
                           s.value("vp", 0) == sched.vp && s.value("microbatches", 0) == sched.microbatches,
                       "{}: schedule in the header differs from {}'s (files from different runs?)", t->path,
                       latest->path);
    const int p = t->header.at("coords").value("pp", -1);
    TRIPOD_INPUT_CHECK(p >= 0 && p < sched.pp, "{}: pipeline coordinate {} outside pp = {}", t->path, p, sched.pp);
    if (have[p]) continue;
    for (const auto& a : s.value("actions", json::array())) {
      auto act = parse_action(a.get<std::string>());
      TRIPOD_INPUT_CHECK(act.has_value(), "{}: '{}' in the header is not an action", t->path, a.dump());
      sched.ranks[p].push_back(*act);
    }
    have[p] = 1;
  }

  // Steps with pipeline work, each one's window and every rank's compute in it.
  std::map<int64_t, std::pair<double, double>> window;  // step -> [first compute start, last compute end]
  for (const RankTrace* t : ranks)
    for (const auto& e : t->events) {
      if (!is_compute(e.cat)) continue;
      auto [it, fresh] = window.try_emplace(e.step, e.ts, e.ts + e.dur);
      if (!fresh) {
        it->second.first = std::min(it->second.first, e.ts);
        it->second.second = std::max(it->second.second, e.ts + e.dur);
      }
    }
  sum.steps = static_cast<int64_t>(window.size());
  // The first step pays for warm-up (allocations, caches): leave it out when there are others.
  std::map<int64_t, std::pair<double, double>> used = window;
  if (used.size() > 1) used.erase(used.begin());
  sum.steps_used = static_cast<int64_t>(used.size());
  sum.drawn_step = window.empty() ? -1 : window.rbegin()->first;
  double f_sum = 0, b_sum = 0, i_sum = 0, w_sum = 0;
  int64_t f_n = 0, b_n = 0, i_n = 0, w_n = 0;
  for (const RankTrace* t : ranks) {
    TraceRankSummary rs;
    rs.rank = t->header.at("rank").get<int>();
    const json& c = t->header.at("coords");
    rs.coords = {c.value("tp", 0), c.value("dp", 0), c.value("pp", 0), c.value("cp", 0)};
    TRIPOD_INPUT_CHECK(rs.coords.cp >= 0 && rs.coords.cp < world, "{}: context-parallel coordinate {} outside a world "
                       "of {} ranks", t->path, rs.coords.cp, world);
    sum.cp = std::max(sum.cp, rs.coords.cp + 1);
    rs.events = static_cast<int>(t->events.size());
    std::map<int64_t, double> busy;
    double cp_us = 0;
    for (const auto& e : t->events) {
      if (is_cp(e.cat) && used.count(e.step)) cp_us += e.dur;
      if (!is_compute(e.cat) || !used.count(e.step)) continue;
      busy[e.step] += e.dur;
      // Split backwards (I, W) are timed apart: the ideal needs both.
      auto a = parse_action(e.name);
      const ActionKind k = a ? a->kind : e.cat == "forward" ? ActionKind::Forward : ActionKind::Backward;
      (k == ActionKind::Forward ? f_sum : k == ActionKind::Input ? i_sum : k == ActionKind::Weight ? w_sum : b_sum) += e.dur;
      ++(k == ActionKind::Forward ? f_n : k == ActionKind::Input ? i_n : k == ActionKind::Weight ? w_n : b_n);
    }
    double busy_us = 0;
    for (const auto& [step, w] : used) {
      const double span = w.second - w.first;
      rs.measured_idle += (span > 0 ? 1.0 - busy[step] / span : 0.0) / static_cast<double>(used.size());
      busy_us += busy[step];
    }
    if (!used.empty()) rs.cp_us_per_step = cp_us / static_cast<double>(used.size());
    if (busy_us > 0) rs.cp_fraction = cp_us / busy_us;
    sum.ranks.push_back(rs);
  }
  sum.mean_forward_us = f_n ? f_sum / f_n : 0;
  const double mean_i = i_n ? i_sum / i_n : 0, mean_w = w_n ? w_sum / w_n : 0;
  sum.mean_backward_us = b_n ? b_sum / b_n : mean_i + mean_w;

  // The ideal: the simulator on the same schedule with the measured mean costs, free messages.
  bool complete = std::all_of(have.begin(), have.end(), [](char h) { return h != 0; });
  if (complete && f_n && (b_n || (i_n && w_n))) {
    try {
      PipeCosts costs{sum.mean_forward_us, sum.mean_backward_us, 0};
      // W's share of a backward as measured (B's time split in the same ratio).
      if (i_n && w_n && mean_i + mean_w > 0) costs.weight = sum.mean_backward_us * mean_w / (mean_i + mean_w);
      Simulation sim = simulate(sched, costs);
      for (auto& rs : sum.ranks) rs.ideal_idle = sim.ranks[rs.coords.pp].bubble;
    } catch (const InputError&) {
      // A schedule the validator refuses has no ideal; the measured figures still stand.
    }
  }

  for (const RankTrace* t : ranks) merged.ranks.push_back(*t);
  return merged;
}

std::string rank_coords_label(const Coords& c, int cp) {
  return cp > 1 ? fmt::format("pp {}, dp {}, cp {}, tp {}", c.pp, c.dp, c.cp, c.tp)
                : fmt::format("pp {}, dp {}, tp {}", c.pp, c.dp, c.tp);
}

std::string render_trace_json(const MergedTrace& merged) {
  const TraceSummary& sum = merged.summary;
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto add = [&](const std::string& ev) {
    if (!first) out += ",\n";
    out += ev;
    first = false;
  };
  for (size_t i = 0; i < merged.ranks.size(); ++i) {
    const RankTrace& t = merged.ranks[i];
    const auto& rs = sum.ranks[i];
    add(json({{"ph", "M"}, {"name", "process_name"}, {"pid", rs.rank},
              {"args", {{"name", fmt::format("rank {} ({})", rs.rank, rank_coords_label(rs.coords, sum.cp))}}}})
            .dump());
    add(json({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rs.rank}, {"args", {{"sort_index", rs.rank}}}})
            .dump());
    for (const auto& e : t.events)
      add(fmt::format("{{\"ph\":\"X\",\"name\":{},\"cat\":\"{}\",\"pid\":{},\"tid\":0,\"ts\":{:.3f},\"dur\":{:.3f},"
                      "\"args\":{{\"step\":{},\"mb\":{},\"chunk\":{}}}}}",
                      json(e.name).dump(), e.cat, rs.rank, e.ts, e.dur, e.step, e.mb, e.chunk));
  }
  return out + "\n]}\n";
}

GanttChart trace_chart(const MergedTrace& merged) {
  const TraceSummary& sum = merged.summary;
  GanttChart ch;
  ch.title = fmt::format("tripod trace: {} schedule, pp={} vp={} microbatches={}, step {}", enum_name(sum.kind), sum.pp, sum.vp,
                         sum.microbatches, sum.drawn_step);
  ch.time_unit = "time (ms)";
  double t0 = 0;
  bool any = false;
  for (const RankTrace& t : merged.ranks)
    for (const auto& e : t.events)
      if (e.step == sum.drawn_step) {
        t0 = any ? std::min(t0, e.ts) : e.ts;
        any = true;
      }
  for (size_t i = 0; i < merged.ranks.size(); ++i) {
    const auto& rs = sum.ranks[i];
    ch.row_labels.push_back(sum.cp > 1 ? fmt::format("rank {} (pp {}, cp {})", rs.rank, rs.coords.pp, rs.coords.cp)
                                       : fmt::format("rank {} (pp {})", rs.rank, rs.coords.pp));
    ch.row_notes.push_back(rs.ideal_idle >= 0
                               ? fmt::format("idle {:.1f}%  (ideal {:.1f}%)", 100 * rs.measured_idle, 100 * rs.ideal_idle)
                               : fmt::format("idle {:.1f}%  (ideal n/a)", 100 * rs.measured_idle));
    for (const auto& e : merged.ranks[i].events) {
      if (e.step != sum.drawn_step) continue;
      ch.boxes.push_back({static_cast<int>(i), (e.ts - t0) / 1e3, (e.ts + e.dur - t0) / 1e3, category_fill(e),
                          is_compute(e.cat) ? e.name : "", fmt::format("{} ({}) {:.3f} ms", e.name, e.cat, e.dur / 1e3),
                          /*inner=*/is_cp(e.cat)});
    }
  }
  ch.footnotes.push_back(fmt::format(
      "idle = 1 - forward/backward time / the step's pipeline window, mean over {} step(s){}", sum.steps_used,
      sum.steps > sum.steps_used ? " (the first step left out)" : ""));
  ch.footnotes.push_back(fmt::format(
      "ideal = simulated bubble of the same schedule with the measured mean forward {:.3f} ms and backward {:.3f} ms, "
      "free communication", sum.mean_forward_us / 1e3, sum.mean_backward_us / 1e3));
  ch.footnotes.push_back(std::string("light: forward, dark: backward (hue by micro-batch); grey: send/recv; "
                                     "purple: reduce; orange: optimizer") +
                         (sum.cp > 1 ? "; teal band: context-parallel K/V exchange inside a forward/backward" : ""));
  return ch;
}

TraceSummary merge_traces(const std::string& run_dir) {
  MergedTrace merged = merge_rank_traces(read_traces(run_dir));
  TraceSummary& sum = merged.summary;
  sum.json_path = (fs::path(run_dir) / "trace.json").string();
  sum.svg_path = (fs::path(run_dir) / "trace.svg").string();
  write_text_file(sum.json_path, render_trace_json(merged));
  write_text_file(sum.svg_path, render_gantt_svg(trace_chart(merged)));
  return sum;
}

}  // namespace tripod
