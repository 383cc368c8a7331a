// The run report: one self-contained HTML page (inline CSS, SVG and a little JavaScript, nothing
// fetched) drawn from a run directory: the config summary, loss curves (train, and validation
// when metrics.jsonl holds eval records), downstream task accuracy and bits per byte over the
// steps (eval_task records), throughput, MFU, learning rate, grad norm, peak memory
// by category, and the measured pipeline timeline with each rank's measured and ideal idle.
//
// Inputs, all under RUN_DIR (train.output_dir), each optional except the directory itself:
//   config.toml      the resolved config (the header: grid, model, batch)
//   metrics.jsonl    the step, eval and downstream task records (train/run_files.h)
//   trace/rank_R.jsonl  the ranks' timelines (parallel/pipeline/trace.h)
//   restarts.jsonl   the launcher's restarts (cause, step resumed from, time lost), when any
//                    (train/run_files.h)
//   plan_check.json  the profiled steps beside the planner's prediction (train.profile_steps)
// A missing piece is stated on the page. Input errors (no RUN_DIR, a metrics line that is not
// JSON or has a field of the wrong type, a malformed trace file) throw InputError naming the
// file and line; only a metrics.jsonl's unfinished last line (a run writing it) is left out. The report never writes into RUN_DIR except its own output file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tripod {

struct ReportInfo {
  std::string path;  // the page written
  int64_t train_steps = 0, eval_points = 0, restarts = 0;
  bool has_config = false, has_metrics = false, has_trace = false;
  std::vector<std::string> notes;  // the missing pieces, as stated on the page
};

// The page for `run_dir`, as HTML text (`info`, when given, says what went in).
std::string render_report(const std::string& run_dir, ReportInfo* info = nullptr);

// Renders the report and writes it to `out` ("" = RUN_DIR/report.html), replacing the file only
// once the page is complete.
ReportInfo write_report(const std::string& run_dir, const std::string& out);

}  // namespace tripod
