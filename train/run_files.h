// The record files of a run directory (train.output_dir), each record defined once, beside its
// JSON both ways, for the writer (the trainer, tripod train) and the readers (tripod report,
// tests, scripts):
//   metrics.jsonl   per logged step a StepRecord; per validation an EvalRecord {"eval":true,...};
//                   per downstream task and evaluation a TaskRecord {"eval_task":true,...}
//   restarts.jsonl  per restart by the launcher (launch/restarts.sh) a RestartRecord
// and the launcher's status file (TRIPOD_LAUNCH_STATUS), a LaunchStatus.
// Readers throw InputError "PATH:LINE: ..." for a line that is not a JSON object or a known field
// of the wrong type; a last line without its newline that does not parse is one being written and
// is left out. Absent or null numbers read as NaN (a skipped step logs a null loss).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "train/straggler.h"
#include "train/tasks.h"

namespace tripod {

// One mixture-of-experts layer's step, over the whole batch.
struct MoeLayerRecord {
  int layer = 0;
  std::vector<double> tokens_per_expert{};  // (token, choice) pairs routed to each expert
  double dropped = 0;                     // pairs past an expert's capacity
  double load_balancing_loss = 0;         // E sum_e f_e P_e, the mean over the micro-batches
  double z_loss = 0;                      // mean logsumexp(logits)^2, the mean over the micro-batches
  // The busiest expert's load over the mean (1: balanced).
  double max_over_mean() const;
};

// One logged training step: {"step","loss","lr","grad_norm","step_time_s","tokens_per_s","mfu",
// "tflops","batch_size","consumed_samples","skipped","skipped_total","mem_peak_bytes":{...},
// "moe":{"layers","tokens_per_expert","dropped_tokens","load_balancing_loss","z_loss",
// "max_over_mean_load"}, "rank_compute_s":{"median","max","max_rank"},"rank_step_s_median",
// "stragglers":[{"rank","compute_s","ratio","intervals"}]}.
struct StepRecord {
  static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  int64_t step = 0;
  double loss = kNaN, lr = kNaN, grad_norm = kNaN;
  double step_time_s = kNaN, tokens_per_s = kNaN, mfu = kNaN;
  double tflops = kNaN;        // model TFLOP/s per rank (the whole run's over the world size)
  int64_t batch_size = 0;      // sequences per step (train.global_batch_size)
  int64_t consumed_samples = -1;
  bool skipped = false;        // non-finite loss or grad norm: the update was skipped
  int64_t skipped_total = 0;
  // Peak bytes per category ("params", ..., "total"): rank 0's as the trainer writes it; a reader
  // also takes one map per rank ({"params": [B per rank]} or a list of objects).
  std::vector<std::map<std::string, int64_t>> memory;
  std::vector<MoeLayerRecord> moe;                  // mixture-of-experts layers, by layer
  std::optional<StragglerSummary> stragglers;       // at the end of a log interval (train.straggler_factor)
};
nlohmann::json to_json(const StepRecord& r);
StepRecord step_record(const nlohmann::json& j, const std::string& where);

// A validation: {"eval":true,"step","split","loss","perplexity","val_loss","val_ppl","tokens",
// "eval_time_s","consumed_samples"} (val_loss and val_ppl repeat loss and perplexity for readers
// of the step records).
struct EvalRecord {
  int64_t step = 0, consumed_samples = -1;
  std::string split = "valid";  // "valid", "test"
  double loss = StepRecord::kNaN, perplexity = StepRecord::kNaN;
  int64_t tokens = 0;
  double seconds = 0;
};
nlohmann::json to_json(const EvalRecord& e);
EvalRecord eval_record(const nlohmann::json& j, const std::string& where);

// One downstream task's figures at an evaluation: {"eval_task":true,"step","consumed_samples",
// "task","kind","examples","requests","eval_time_s",<metric>,<metric>_stderr (multiple choice)}.
struct TaskRecord {
  int64_t step = 0, consumed_samples = -1, examples = 0, requests = 0;
  std::string task, kind;           // its tag; hellaswag, multiple_choice, bits_per_byte
  double seconds = 0;
  std::vector<TaskMetric> metrics;  // acc, acc_norm; bits_per_byte, byte_perplexity, word_perplexity
  const TaskMetric* find(std::string_view name) const;
};
TaskRecord task_record(int64_t step, int64_t consumed_samples, const TaskResult& r);
nlohmann::json to_json(const TaskRecord& t);
TaskRecord task_record(const nlohmann::json& j, const std::string& where);

// RUN_DIR/metrics.jsonl as read back.
struct RunMetrics {
  std::vector<StepRecord> train;  // by step; a resumed run's later record of a step wins
  std::vector<EvalRecord> eval;   // by (split, step), the same way
  std::vector<TaskRecord> tasks;  // by (task, step), the same way
  int64_t superseded = 0;         // records replaced by a later one of the same step
  int64_t other_records = 0;      // objects that are none of them (left out)
  bool unfinished_line = false;   // the file ends in a partial line (left out): a run writing it
};
RunMetrics read_metrics(const std::string& path);

// One restart by the launcher: the cause, the step this attempt resumed from, the downtime (from
// the failure to now) and the time lost (from the end of the work kept, the loaded checkpoint's
// commit or the failed attempt's start, to now).
struct RestartRecord {
  int64_t attempt = 0, resumed_from_step = 0, exit_status = 0;
  std::string cause, checkpoint;
  double failed_at = 0, resumed_at = 0, downtime_s = 0, time_lost_s = 0;  // unix seconds; seconds
};
nlohmann::json to_json(const RestartRecord& r);
RestartRecord restart_record(const nlohmann::json& j, const std::string& where);
// Appends one line to RUN_DIR/restarts.jsonl.
void append_restart(const std::string& run_dir, const RestartRecord& r);
std::vector<RestartRecord> read_restarts(const std::string& path);

// What rank 0 tells the launcher (TRIPOD_LAUNCH_STATUS): where the run lives and how far it got,
// {"output_dir","checkpoint_dir","state","step","steps"}; state "starting", "running", then
// "finished" or "stopped" (by a signal, before its last step).
struct LaunchStatus {
  std::string output_dir, checkpoint_dir, state;
  int64_t step = 0, steps = 0;
};
// Written whole and renamed into place, so the launcher never reads half a file.
void write_launch_status(const std::string& path, const LaunchStatus& s);

}  // namespace tripod
