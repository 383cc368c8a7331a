// `tripod schedule --kind gpipe|1f1b|interleaved --pp P --vp V --microbatches M [--svg FILE]
//  [--json] [--csv FILE]`: builds (or loads) a pipeline schedule, validates it, simulates it
// without compute and prints each rank's actions, bubble fraction and peak in-flight activations.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/simulate.h"
#include "report/svg.h"
#include "config/memory_plan.h"
#include "config/layout.h"
#include "train/commands/commands.h"

namespace tripod {

namespace {

struct ScheduleOptions {
  std::string kind, csv, svg;
  std::optional<int> pp, vp, microbatches;
  bool json = false;
  PipeCosts costs;
  std::string config;  // a run's config: its schedule, plus the per-rank memory estimate
  std::vector<std::string> sets;
};

Schedule make_schedule(const ScheduleOptions& o, const std::optional<Config>& cfg) {
  if (cfg) {
    TRIPOD_INPUT_CHECK(o.kind.empty() && o.csv.empty() && !o.pp && !o.vp && !o.microbatches,
                       "--config {} sets the schedule; leave out --kind, --csv, --pp, --vp and --microbatches",
                       o.config);
    return tripod::make_schedule(*cfg);
  }
  if (!o.csv.empty()) {
    TRIPOD_INPUT_CHECK(o.kind.empty(), "--kind {} and --csv {}: give one or the other", o.kind, o.csv);
    Schedule s = load_schedule_csv(o.csv);
    // Numbers given beside --csv must agree with the file.
    TRIPOD_INPUT_CHECK(!o.pp || *o.pp == s.pp, "--pp {}: {} has {} rank rows", *o.pp, o.csv, s.pp);
    TRIPOD_INPUT_CHECK(!o.vp || *o.vp == s.vp, "--vp {}: {} uses {} chunks per rank", *o.vp, o.csv, s.vp);
    TRIPOD_INPUT_CHECK(!o.microbatches || *o.microbatches == s.microbatches, "--microbatches {}: {} has {}",
                       *o.microbatches, o.csv, s.microbatches);
    return s;
  }
  TRIPOD_INPUT_CHECK(!o.kind.empty(), "--kind is required (gpipe, 1f1b or interleaved), or --csv FILE");
  TRIPOD_INPUT_CHECK(o.pp.has_value(), "--pp is required (the number of pipeline stages, >= 1)");
  TRIPOD_INPUT_CHECK(o.microbatches.has_value(), "--microbatches is required (micro-batches per step, >= 1)");
  return build_schedule(o.kind, *o.pp, o.vp.value_or(1), *o.microbatches);
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
  ch.title = fmt::format("{} schedule: pp={} vp={} microbatches={}   bubble {}", s.kind, s.pp, s.vp, s.microbatches,
                         percent(sim.bubble));
  ch.time_unit = fmt::format("time (forward {:g}, backward {:g}, communication {:g})", costs.forward, costs.backward,
                             costs.comm);
  for (int r = 0; r < s.pp; ++r) {
    const auto& rs = sim.ranks[r];
    ch.row_labels.push_back(fmt::format("rank {}", r));
    ch.row_notes.push_back(fmt::format("bubble {}, peak {}", percent(rs.bubble), rs.peak_inflight));
    for (const auto& t : rs.timeline)
      ch.boxes.push_back({r, t.start, t.end, action_fill(t.action), t.action.str(),
                          fmt::format("{} (virtual stage {}) {:g}..{:g}", t.action.str(), s.stage(r, t.action.chunk),
                                      t.start, t.end)});
  }
  ch.label_duration = std::min(costs.forward, costs.backward);
  ch.footnotes.push_back("F<micro-batch>.<chunk>: light = forward, dark = backward, hue by micro-batch");
  ch.footnotes.push_back("bubble = idle time / makespan per rank; peak = most (micro-batch, chunk) activations held");
  return ch;
}

int run_schedule(const ScheduleOptions& o) {
  std::optional<Config> cfg;
  if (!o.config.empty()) {
    cfg = load_config(o.config, o.sets, ConfigUse{.training = false, .data = false});
    const ParallelConfig& pc = cfg->parallel;
    validate_layout(*cfg, pc.tp * pc.pp * std::max(pc.dp, 1));
  }
  Schedule s = make_schedule(o, cfg);
  PipePlan plan = plan_pipeline(s);  // refuses a broken schedule before anything else
  Simulation sim = simulate(s, plan, o.costs);
  if (!o.svg.empty()) write_text_file(o.svg, render_gantt_svg(schedule_chart(s, sim, o.costs)));

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
                       {"peak_inflight", rs.peak_inflight},
                       {"peak_inflight_per_chunk", rs.peak_inflight_per_chunk},
                       {"peak_buffers", plan_peak_buffers(plan, s, r)}});
    }
    nlohmann::json out = {{"kind", s.kind},
                          {"pp", s.pp},
                          {"vp", s.vp},
                          {"microbatches", s.microbatches},
                          {"costs", {{"forward", o.costs.forward}, {"backward", o.costs.backward}, {"comm", o.costs.comm}}},
                          {"makespan", sim.makespan},
                          {"bubble", sim.bubble},
                          {"peak_inflight", sim.peak_inflight},
                          {"messages", plan.messages.size()},
                          {"ranks", std::move(ranks)}};
    if (cfg) {
      nlohmann::json mem = nlohmann::json::array();
      for (const RankMemory& m : plan_memory(*cfg))
        mem.push_back({{"rank", m.rank}, {"dp", m.coords.dp}, {"pp", m.coords.pp}, {"tp", m.coords.tp},
                       {"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer},
                       {"activations", m.activations}, {"total", m.total()}});
      out["memory_bytes"] = std::move(mem);
    }
    fmt::print("{}\n", out.dump());
    return 0;
  }
  fmt::print("{} schedule: pp={} vp={} microbatches={}\n", s.kind, s.pp, s.vp, s.microbatches);
  for (int r = 0; r < s.pp; ++r) {
    std::string line;
    for (const Action& a : s.ranks[r]) {
      if (!line.empty()) line += ' ';
      line += a.str();
    }
    fmt::print("rank {}: {}\n", r, line);
  }
  fmt::print("\nsimulated with forward {:g}, backward {:g}, communication {:g} per action:\n", o.costs.forward,
             o.costs.backward, o.costs.comm);
  fmt::print("{:>5} {:>10} {:>8} {:>15}{}\n", "rank", "busy", "bubble", "peak in-flight", s.vp > 1 ? "  (per chunk)" : "");
  for (int r = 0; r < s.pp; ++r) {
    const auto& rs = sim.ranks[r];
    fmt::print("{:>5} {:>10g} {:>8} {:>15}{}\n", r, rs.busy, percent(rs.bubble), rs.peak_inflight,
               s.vp > 1 ? "  (" + per_chunk(rs) + ")" : "");
  }
  fmt::print("makespan {:g}; bubble {} (mean over ranks of idle time / makespan); peak in-flight {} micro-batch "
             "activations{}\n",
             sim.makespan, percent(sim.bubble), sim.peak_inflight,
             s.vp > 1 ? fmt::format(" of one chunk each ({:.2f} stages' worth)", double(sim.peak_inflight) / s.vp) : "");
  if (!o.svg.empty()) fmt::print("chart: {}\n", o.svg);
  if (cfg) fmt::print("\n{}", memory_table(*cfg, plan_memory(*cfg)));
  return 0;
}

}  // namespace

CommandFn add_schedule_command(CLI::App& app) {
  auto o = std::make_shared<ScheduleOptions>();
  CLI::App* sub = app.add_subcommand("schedule", "Build or load a pipeline schedule, validate and simulate it (no compute)");
  sub->add_option("--kind", o->kind, "gpipe, 1f1b or interleaved");
  sub->add_option("--pp", o->pp, "Pipeline stages (ranks)");
  sub->add_option("--vp", o->vp, "Model chunks per rank (interleaved; default 1)");
  sub->add_option("--microbatches", o->microbatches, "Micro-batches per step");
  sub->add_option("--csv", o->csv, "Load a custom schedule: one line of comma-separated actions (F3.1, B2.0) per rank");
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
