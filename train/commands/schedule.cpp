// `tripod schedule --kind gpipe|1f1b|interleaved|zb-h1|zb-h2|zbv|dualpipev|auto --pp P --vp V
//  --microbatches M [--costs F,I,W] [--svg FILE] [--json] [--csv FILE] [--save-csv FILE]`: builds
// (or loads) a pipeline schedule, validates it, simulates it without compute and prints each
// rank's actions, idle time, bubble fraction and peak activations.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/simulate.h"
#include "config/layout.h"
#include "config/memory_plan.h"
#include "parallel/pipeline/zero_bubble.h"
#include "report/svg.h"
#include "plan/cost_model.h"
#include "train/commands/commands.h"

namespace tripod {

namespace {

struct ScheduleOptions {
  std::string kind, csv, svg, save_csv;
  std::string csv_format = "auto", save_format = "tripod", placement, fiw;
  std::optional<int> pp, vp, microbatches;
  bool json = false;
  PipeCosts costs;
  double memory_cap = 0;  // auto: chunk activations per rank; 0: what 1F1B holds
  std::string config;  // a run's config: its schedule, plus the per-rank memory estimate
  std::vector<std::string> sets;
};

// --costs F,I,W: forward, input-gradient and weight-gradient times (B = I + W).
void apply_fiw(ScheduleOptions& o) {
  if (o.fiw.empty()) return;
  std::vector<double> v;
  size_t pos = 0;
  while (pos <= o.fiw.size()) {
    size_t comma = o.fiw.find(',', pos);
    std::string cell = o.fiw.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? o.fiw.size() + 1 : comma + 1;
    double x = 0;
    size_t used = 0;
    try {
      x = std::stod(cell, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TRIPOD_INPUT_CHECK(used > 0 && used == cell.size() && std::isfinite(x) && x >= 0,
                       "--costs {}: '{}' is not a time >= 0 (expected F,I,W, e.g. 1,1,1)", o.fiw, cell);
    v.push_back(x);
  }
  TRIPOD_INPUT_CHECK(v.size() == 3, "--costs {}: expected three times F,I,W (forward, input gradient, weight gradient)",
                     o.fiw);
  o.costs.forward = v[0];
  o.costs.backward = v[1] + v[2];
  o.costs.weight = v[2];
}

struct Built {
  Schedule schedule;
  std::optional<AutoSchedule> automatic;
};

// How this command's user names the settings the schedule rules check.
constexpr ScheduleSettingNames kOptionNames{
    .schedule = "--kind", .pp = "--pp", .vp = "--vp", .placement = "--placement", .microbatches = "--microbatches"};

Built make_schedule(const ScheduleOptions& o, const std::optional<Config>& cfg) {
  if (cfg) {
    TRIPOD_INPUT_CHECK(o.kind.empty() && o.csv.empty() && !o.pp && !o.vp && !o.microbatches,
                       "--config {} sets the schedule; leave out --kind, --csv, --pp, --vp and --microbatches",
                       o.config);
    return {tripod::make_schedule(*cfg), std::nullopt};
  }
  auto format = parse_csv_format(o.csv_format);
  TRIPOD_INPUT_CHECK(format.has_value(), "--csv-format {} is unknown (valid: auto, tripod, pytorch)", o.csv_format);
  std::optional<Placement> placement;
  if (!o.placement.empty()) {
    placement = parse_placement(o.placement);
    TRIPOD_INPUT_CHECK(placement.has_value(), "--placement {} is unknown (valid: loop, v)", o.placement);
  }
  if (!o.csv.empty()) {
    TRIPOD_INPUT_CHECK(o.kind.empty(), "--kind {} and --csv {}: give one or the other", o.kind, o.csv);
    Schedule s = load_schedule_csv(o.csv, *format);
    // Numbers given beside --csv must agree with the file.
    TRIPOD_INPUT_CHECK(!o.pp || *o.pp == s.pp, "--pp {}: {} has {} rank rows", *o.pp, o.csv, s.pp);
    TRIPOD_INPUT_CHECK(!o.vp || *o.vp == s.vp, "--vp {}: {} uses {} chunks per rank", *o.vp, o.csv, s.vp);
    TRIPOD_INPUT_CHECK(!o.microbatches || *o.microbatches == s.microbatches, "--microbatches {}: {} has {}",
                       *o.microbatches, o.csv, s.microbatches);
    TRIPOD_INPUT_CHECK(!placement || *placement == s.placement, "--placement {}: {} uses the {} placement",
                       o.placement, o.csv, placement_name(s.placement));
    return {s, std::nullopt};
  }
  TRIPOD_INPUT_CHECK(!o.kind.empty(), "--kind is required ({}), or --csv FILE", enum_choices<ScheduleKind>());
  TRIPOD_INPUT_CHECK(o.pp.has_value(), "--pp is required (the number of pipeline stages, >= 1)");
  TRIPOD_INPUT_CHECK(o.microbatches.has_value(), "--microbatches is required (micro-batches per step, >= 1)");
  const ScheduleKind kind = parse_schedule_kind(o.kind, "--kind");
  const Placement where = placement.value_or(default_placement(kind));
  const int vp = o.vp.value_or(default_vp(where));
  check_schedule_kind(kind, *o.pp, vp, *o.microbatches, where, kOptionNames);
  if (kind == ScheduleKind::Auto) {
    TRIPOD_INPUT_CHECK(std::isfinite(o.memory_cap) && o.memory_cap >= 0,
                       "--memory-cap {}: expected chunk activations per rank >= 0 (0: what 1F1B holds)", o.memory_cap);
    const int S = *o.pp * vp;
    StageCosts sc;
    sc.forward.assign(S, o.costs.forward);
    sc.backward.assign(S, o.costs.backward);
    sc.weight.assign(S, o.costs.w());
    AutoSchedule a = auto_schedule(*o.pp, vp, where, *o.microbatches, sc, o.costs.comm, o.memory_cap,
                                   o.costs.weight_memory);
    Schedule s = a.schedule;
    return {s, std::move(a)};
  }
  return {build_schedule(kind, *o.pp, vp, *o.microbatches, where), std::nullopt};
}

std::string percent(double f) { return fmt::format("{:.1f}%", 100 * f); }

std::string per_chunk(const RankSimulation& r) {
  std::string s;
  for (size_t c = 0; c < r.peak_inflight_per_chunk.size(); ++c)
    s += fmt::format("{}{}", c ? ", " : "", r.peak_inflight_per_chunk[c]);
  return s;
}

GanttChart schedule_chart(const Schedule& s, const Simulation& sim, const PipeCosts& costs) {
  GanttChart ch;
  ch.title = fmt::format("{} schedule: pp={} vp={}{} microbatches={}   bubble {}", enum_name(s.kind), s.pp, s.vp,
                         s.placement == Placement::V ? " (v placement)" : "", s.microbatches, percent(sim.bubble));
  ch.time_unit = fmt::format("time (forward {:g}, backward {:g} = I {:g} + W {:g}, communication {:g})", costs.forward,
                             costs.backward, costs.i(), costs.w(), costs.comm);
  for (int r = 0; r < s.pp; ++r) {
    const auto& rs = sim.ranks[r];
    ch.row_labels.push_back(fmt::format("rank {}", r));
    ch.row_notes.push_back(fmt::format("idle {:g} ({}), peak {:g}", rs.idle, percent(rs.bubble), rs.peak_memory));
    for (const auto& t : rs.timeline)
      ch.boxes.push_back({r, t.start, t.end, action_fill(t.action), t.action.str(),
                          fmt::format("{} (virtual stage {}) {:g}..{:g}", t.action.str(), s.stage(r, t.action.chunk),
                                      t.start, t.end)});
  }
  ch.label_duration = std::min({costs.forward, costs.i(), costs.w()});
  ch.footnotes.push_back(
      "F<micro-batch>.<chunk>: light = forward, dark = backward (B), medium = input gradient (I), grey = weight "
      "gradient (W); hue by micro-batch");
  ch.footnotes.push_back("idle = makespan - busy per rank (bubble: as a fraction); peak = most chunk activations held");
  return ch;
}

int run_schedule(ScheduleOptions o) {
  apply_fiw(o);
  std::optional<Config> cfg;
  if (!o.config.empty()) {
    cfg = load_config(o.config, o.sets, ConfigUse{.training = false, .data = false});
    const ParallelConfig& pc = cfg->parallel;
    validate_layout(*cfg, pc.tp * pc.pp * pc.cp * std::max(pc.dp, 1));
    resolve_layer_split(*cfg);  // parallel.layers_per_stage = "auto"
  }
  auto save_format = parse_csv_format(o.save_format);
  TRIPOD_INPUT_CHECK(save_format && *save_format != ScheduleCsvFormat::Auto,
                     "--save-format {} is unknown (valid: tripod, pytorch)", o.save_format);
  Built built = make_schedule(o, cfg);
  const Schedule& s = built.schedule;
  PipePlan plan = plan_pipeline(s);  // refuses a broken schedule before anything else
  Simulation sim = simulate(s, plan, o.costs);
  if (!o.svg.empty()) write_text_file(o.svg, render_gantt_svg(schedule_chart(s, sim, o.costs)));
  if (!o.save_csv.empty())
    write_text_file(o.save_csv, *save_format == ScheduleCsvFormat::PyTorch ? schedule_csv_pytorch(s) : schedule_csv(s));

  if (o.json) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < s.pp; ++r) {
      const auto& rs = sim.ranks[r];
      nlohmann::json actions = nlohmann::json::array();
      for (const Action& a : s.ranks[r]) actions.push_back(a.str());
      ranks.push_back({{"rank", r},
                       {"actions", std::move(actions)},
                       {"bubble", rs.bubble},
                       {"busy", rs.busy},
                       {"idle", rs.idle},
                       {"span", rs.span},
                       {"overlapped_idle", rs.overlapped_idle},
                       {"peak_inflight", rs.peak_inflight},
                       {"peak_inflight_per_chunk", rs.peak_inflight_per_chunk},
                       {"peak_memory", rs.peak_memory},
                       {"peak_buffers", plan_peak_buffers(plan, s, r)}});
    }
    nlohmann::json out = {{"kind", enum_name(s.kind)},
                          {"pp", s.pp},
                          {"vp", s.vp},
                          {"placement", placement_name(s.placement)},
                          {"microbatches", s.microbatches},
                          {"costs",
                           {{"forward", o.costs.forward},
                            {"backward", o.costs.backward},
                            {"input", o.costs.i()},
                            {"weight", o.costs.w()},
                            {"comm", o.costs.comm},
                            {"weight_memory", o.costs.weight_memory}}},
                          {"makespan", sim.makespan},
                          {"period", sim.period},
                          {"bubble", sim.bubble},
                          {"peak_inflight", sim.peak_inflight},
                          {"peak_memory", sim.peak_memory},
                          {"messages", plan.messages.size()},
                          {"ranks", std::move(ranks)}};
    if (built.automatic) {
      nlohmann::json cands = nlohmann::json::array();
      for (const auto& c : built.automatic->candidates)
        cands.push_back({{"name", c.name}, {"makespan", c.makespan}, {"peak_memory", c.peak_memory}, {"fits", c.fits}});
      out["auto"] = {{"chosen", built.automatic->chosen}, {"candidates", std::move(cands)}};
    }
    if (cfg) {
      nlohmann::json mem = nlohmann::json::array();
      for (const RankMemory& m : plan_memory(*cfg))
        mem.push_back({{"rank", m.rank}, {"dp", m.coords.dp}, {"pp", m.coords.pp}, {"cp", m.coords.cp},
                       {"tp", m.coords.tp}, {"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer},
                       {"activations", m.activations}, {"total", m.total()}});
      out["memory_bytes"] = std::move(mem);
    }
    fmt::print("{}\n", out.dump());
    return 0;
  }
  fmt::print("{} schedule: pp={} vp={}{} microbatches={}\n", enum_name(s.kind), s.pp, s.vp,
             s.placement == Placement::V ? " placement=v" : "", s.microbatches);
  for (int r = 0; r < s.pp; ++r) {
    std::string line;
    for (const Action& a : s.ranks[r]) {
      if (!line.empty()) line += ' ';
      line += a.str();
    }
    fmt::print("rank {}: {}\n", r, line);
  }
  if (built.automatic) {
    fmt::print("\nauto: chose {} among {} candidates (makespan, peak chunk activations per rank):\n",
               built.automatic->chosen, built.automatic->candidates.size());
    for (const auto& c : built.automatic->candidates)
      fmt::print("  {:<24} {:>10g} {:>8g}{}\n", c.name, c.makespan, c.peak_memory, c.fits ? "" : "  over the cap");
  }
  fmt::print("\nsimulated with forward {:g}, backward {:g} (I {:g} + W {:g}), communication {:g} per action:\n",
             o.costs.forward, o.costs.backward, o.costs.i(), o.costs.w(), o.costs.comm);
  fmt::print("{:>5} {:>10} {:>10} {:>8} {:>12} {:>15} {:>12}{}\n", "rank", "busy", "idle", "bubble", "overlapped",
             "peak in-flight", "peak memory", s.vp > 1 ? "  (per chunk)" : "");
  for (int r = 0; r < s.pp; ++r) {
    const auto& rs = sim.ranks[r];
    fmt::print("{:>5} {:>10g} {:>10g} {:>8} {:>12g} {:>15} {:>12g}{}\n", r, rs.busy, rs.idle, percent(rs.bubble),
               rs.overlapped_idle, rs.peak_inflight, rs.peak_memory, s.vp > 1 ? "  (" + per_chunk(rs) + ")" : "");
  }
  fmt::print("makespan {:g}; bubble {} (mean over ranks of idle time / makespan); peak in-flight {} micro-batch "
             "activations{}\n",
             sim.makespan, percent(sim.bubble), sim.peak_inflight,
             s.vp > 1 ? fmt::format(" of one chunk each ({:.2f} stages' worth)", double(sim.peak_inflight) / s.vp) : "");
  fmt::print("overlapped: period {:g} (the longest rank span, when steps overlap with no optimizer sync); peak memory "
             "{:g} chunk activations (W-pending at {:g})\n",
             sim.period, sim.peak_memory, o.costs.weight_memory);
  if (!o.svg.empty()) fmt::print("chart: {}\n", o.svg);
  if (!o.save_csv.empty()) fmt::print("schedule: {} ({} format)\n", o.save_csv, o.save_format);
  if (cfg) fmt::print("\n{}", memory_table(*cfg, plan_memory(*cfg)));
  return 0;
}

}  // namespace

CommandFn add_schedule_command(CLI::App& app) {
  auto o = std::make_shared<ScheduleOptions>();
  CLI::App* sub = app.add_subcommand("schedule", "Build or load a pipeline schedule, validate and simulate it (no compute)");
  sub->add_option("--kind", o->kind, "Schedule to build: " + enum_choices<ScheduleKind>());
  sub->add_option("--pp", o->pp, "Pipeline stages (ranks)");
  sub->add_option("--vp", o->vp, "Model chunks per rank (interleaved; default 1)");
  sub->add_option("--microbatches", o->microbatches, "Micro-batches per step");
  sub->add_option("--csv", o->csv,
                  "Load a custom schedule: one line of comma-separated actions (F3.1, B2.0, I2.0, W2.0) per rank, or "
                  "PyTorch pipelining's compute_only CSV (0F1, 1I0, 1W0)");
  sub->add_option("--csv-format", o->csv_format, "Format of --csv: auto (default: from the first cell), tripod, pytorch");
  sub->add_option("--save-csv", o->save_csv, "Write the schedule as CSV (see --save-format)");
  sub->add_option("--save-format", o->save_format, "Format of --save-csv: tripod (default) or pytorch");
  sub->add_option("--placement", o->placement,
                  "Stage placement: loop or v (zbv and dualpipev use v; auto searches the one given, default loop)");
  sub->add_option("--costs", o->fiw, "F,I,W: forward, input-gradient and weight-gradient time per chunk (B = I + W)");
  sub->add_option("--memory-cap", o->memory_cap,
                  "auto: most chunk activations a rank may hold (default 0: what 1F1B holds, pp*vp)");
  sub->add_option("--weight-memory", o->costs.weight_memory,
                  "Activations held between I and W, per unit F holds (default 1: W keeps each GEMM's input and "
                  "output gradient)");
  sub->add_option("--svg", o->svg, "Write the simulated timeline as an SVG Gantt chart");
  sub->add_flag("--json", o->json, "Print one JSON object (actions, bubble, peak in-flight per rank)");
  sub->add_option("--forward-cost", o->costs.forward, "Time units per forward of one chunk (default 1)");
  sub->add_option("--backward-cost", o->costs.backward, "Time units per backward of one chunk (default 2)");
  sub->add_option("--comm-cost", o->costs.comm, "Time units per message between ranks (default 0)");
  sub->add_option("--config", o->config,
                  "Take the schedule from a training config and add its per-rank memory estimate");
  sub->add_option("--set", o->sets, "Override a config value: section.key=value (with --config; repeatable)");
  return [o] { return run_schedule(*o); };
}

}  // namespace tripod
