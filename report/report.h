// The run report: one self-contained HTML page (inline CSS, SVG and a little JavaScript, nothing
// fetched) drawn from a run directory: the config summary, loss curves (train, and validation
// when metrics.jsonl holds eval records), downstream task accuracy and bits per byte over the
// steps (eval_task records), throughput, MFU, learning rate, grad norm, peak memory
// by category, and the measured pipeline timeline with each rank's measured and ideal idle.
//
// Inputs, all under RUN_DIR (train.output_dir), each optional except the directory itself:
//   config.toml      the resolved config (the header: grid, model, batch)
//   metrics.jsonl    one object per logged step {"step","loss","lr",...,"mem_peak_bytes":{...}}
//                    (at the end of a log interval of a multi-rank run also "rank_compute_s":
//                    {"median","max","max_rank"} and "stragglers":[{"rank","compute_s","ratio",
//                    "intervals"}], train/straggler.h), and eval records
//                    {"eval":true,"split","step","loss","perplexity"}, and downstream task records
//                    {"eval_task":true,"step","task","kind","examples",<metric>,...}
//   trace/rank_R.jsonl  the ranks' timelines (parallel/pipeline/trace.h)
//   restarts.jsonl   the launcher's restarts (cause, step resumed from, time lost), when any
//   plan_check.json  the profiled steps beside the planner's prediction (train.profile_steps)
// A missing piece is stated on the page. Input errors (no RUN_DIR, a metrics line that is not
// JSON or has a field of the wrong type, a malformed trace file) throw InputError naming the
// file and line; only a metrics.jsonl's unfinished last line (a run writing it) is left out. The report never writes into RUN_DIR except its own output file.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace tripod {

// One logged training step. Absent or null numbers are NaN (a skipped step logs a null loss).
// A rank named as a straggler at a step (train/straggler.h).
struct StragglerRecord {
  int rank = 0;
  double compute_s = 0, ratio = 0;
  int intervals = 0;
};

struct TrainRecord {
  int64_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0, step_time_s = 0, tokens_per_s = 0, mfu = 0;
  int64_t consumed_samples = -1;
  bool skipped = false;
  // Peak bytes per category ("params", ..., "total"), one map per rank that the record holds
  // (rank 0 alone today; a list when the ranks' peaks are gathered).
  std::vector<std::map<std::string, int64_t>> memory;
  // The ranks' compute time per step over the log interval ending here (NaN when not gathered),
  // and the stragglers named.
  double compute_median_s = std::numeric_limits<double>::quiet_NaN(), compute_max_s = compute_median_s;
  int compute_max_rank = -1;
  std::vector<StragglerRecord> stragglers;
  // A mixture of experts' step ("moe" in metrics.jsonl): per MoE layer its index, the (token,
  // choice) pairs each expert took over the step, and the pairs the capacity dropped.
  std::vector<int> moe_layers;
  std::vector<std::vector<double>> tokens_per_expert;
  std::vector<double> moe_dropped;
};

struct EvalRecord {
  int64_t step = 0;
  std::string split;  // "valid", "test", ...
  double loss = 0, perplexity = 0;
};

// One downstream task's figures at an evaluation ({"eval_task":true,...}, train/metrics.h).
struct TaskRecord {
  int64_t step = 0, examples = 0;
  std::string task, kind;                 // its tag; hellaswag, multiple_choice, bits_per_byte
  std::map<std::string, double> metrics;  // acc, acc_norm; bits_per_byte, byte_perplexity, word_perplexity
};

struct RunMetrics {
  std::vector<TrainRecord> train;  // by step; a resumed run's later record of a step wins
  std::vector<EvalRecord> eval;    // by (split, step), the same way
  std::vector<TaskRecord> tasks;   // by (task, step), the same way
  int64_t superseded = 0;          // records replaced by a later one of the same step
  int64_t other_records = 0;       // objects that are neither (left out)
  bool unfinished_line = false;    // the file ends in a partial line (left out): a run writing it
};

// Reads RUN_DIR/metrics.jsonl (`path`). InputError "PATH:LINE: ..." on a line that is not a JSON
// object or whose known fields have the wrong type; a last line with no newline that does not
// parse is one being written, and is left out.
RunMetrics read_metrics(const std::string& path);

// One restart of the run by the launcher (launch/restarts.sh), from RUN_DIR/restarts.jsonl.
struct RestartRecord {
  int64_t attempt = 0, resumed_from_step = 0, exit_status = 0;
  std::string cause;
  double failed_at = 0, time_lost_s = 0, downtime_s = 0;
};

// Reads RUN_DIR/restarts.jsonl (`path`); InputError "PATH:LINE: ..." like read_metrics.
std::vector<RestartRecord> read_restarts(const std::string& path);

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
