// `tripod report RUN_DIR [--out FILE]`: one self-contained HTML page of a run (curves, memory,
// pipeline timeline, config), by default RUN_DIR/report.html.
#include <fmt/format.h>

#include "train/commands/commands.h"
#include "report/report.h"

namespace tripod {

namespace {

struct ReportOptions {
  std::string run_dir, out;
};

int run_report(const ReportOptions& o) {
  ReportInfo info = write_report(o.run_dir, o.out);
  fmt::print("wrote {}: {} logged step(s), {} eval point(s), {}, {}\n", info.path, info.train_steps, info.eval_points,
             info.has_trace ? "pipeline timeline" : "no timeline", info.has_config ? "config" : "no config");
  for (const auto& n : info.notes) fmt::print("note: {}\n", n);
  return 0;
}

}  // namespace

CommandFn add_report_command(CLI::App& app) {
  auto opts = std::make_shared<ReportOptions>();
  CLI::App* sub = app.add_subcommand(
      "report", "Write one self-contained HTML page of a run: loss, throughput, MFU, memory, pipeline timeline");
  sub->add_option("run_dir", opts->run_dir, "The run directory (train.output_dir)")->required();
  sub->add_option("--out", opts->out, "The page to write (default RUN_DIR/report.html)");
  return [opts] { return run_report(*opts); };
}

}  // namespace tripod
