// `tripod trace merge RUN_DIR`: merges the ranks' trace files of a run into RUN_DIR/trace.json
// (Chrome trace format) and RUN_DIR/trace.svg (Gantt chart, measured vs ideal idle fractions).
// `tripod trace diagnose RUN_DIR [--json]`: which ranks a hung or timed-out run was blocked in,
// from the flight recorder's dumps in RUN_DIR/flight/.
#include <fmt/format.h>

#include "parallel/comm/flight_diagnose.h"
#include "report/trace_merge.h"
#include "train/commands/commands.h"

namespace tripod {

namespace {

int run_trace_merge(const std::string& run_dir) {
  TraceSummary s = merge_traces(run_dir);
  fmt::print("{} schedule, pp={} vp={} microbatches={}: {} step(s) traced, {} averaged\n", enum_name(s.kind), s.pp, s.vp,
             s.microbatches, s.steps, s.steps_used);
  // The cp axis and the time of its exchanges only when the run used it.
  const bool cp = s.cp > 1;
  fmt::print("{:>5} {:>4} {:>4}{} {:>4} {:>8} {:>10} {:>10}{}\n", "rank", "pp", "dp", cp ? fmt::format(" {:>4}", "cp") : "",
             "tp", "events", "idle", "ideal", cp ? fmt::format(" {:>14}", "cp ms/step") : "");
  for (const auto& r : s.ranks)
    fmt::print("{:>5} {:>4} {:>4}{} {:>4} {:>8} {:>9.1f}% {:>10}{}\n", r.rank, r.coords.pp, r.coords.dp,
               cp ? fmt::format(" {:>4}", r.coords.cp) : "", r.coords.tp, r.events, 100 * r.measured_idle,
               r.ideal_idle >= 0 ? fmt::format("{:.1f}%", 100 * r.ideal_idle) : "n/a",
               cp ? fmt::format(" {:>14.3f}", r.cp_us_per_step / 1e3) : "");
  fmt::print("wrote {} and {}\n", s.json_path, s.svg_path);
  return 0;
}

int run_trace_diagnose(const std::string& run_dir, bool json) {
  const std::vector<FlightRing> rings = read_flight_rings(run_dir);
  const FlightDiagnosis d = diagnose_flight(rings);
  if (json) {
    fmt::print("{}\n", d.json.dump());
    return 0;
  }
  fmt::print("flight records of {} of {} rank(s) in {}/flight\n", rings.size(), d.json["world_size"].get<int>(),
             run_dir);
  for (const std::string& line : d.lines) fmt::print("{}\n", line);
  return 0;
}

}  // namespace

CommandFn add_trace_command(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("trace", "Work with the measured timelines of a run");
  sub->require_subcommand(1);
  CLI::App* merge = sub->add_subcommand("merge", "Merge RUN_DIR/trace/rank_*.jsonl into RUN_DIR/trace.json and trace.svg");
  merge->add_option("run_dir", *run_dir, "The run directory (train.output_dir)")->required();
  CLI::App* diagnose = sub->add_subcommand(
      "diagnose", "Name the ranks a hung run waits for, from the flight recorder's dumps in RUN_DIR/flight/");
  diagnose->add_option("run_dir", *run_dir, "The run directory (train.output_dir)")->required();
  auto json = std::make_shared<bool>(false);
  diagnose->add_flag("--json", *json, "Print one JSON object (missing, blocked, culprits, lines)");
  return [run_dir, merge, json] {
    return merge->parsed() ? run_trace_merge(*run_dir) : run_trace_diagnose(*run_dir, *json);
  };
}

}  // namespace tripod
