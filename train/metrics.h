// Step metrics: a progress line on the console, one JSON object per logged step in
// RUN_DIR/metrics.jsonl and, with train.tensorboard_dir, the same numbers as TensorBoard scalars
// (written by world rank 0, which holds every logged number: the loss and grad norm are world sums).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "train/run_files.h"
#include "train/tensorboard.h"

namespace tripod {

// The TensorBoard scalars of a step record, under Megatron-LM's names where it has one:
//   lm loss, learning-rate, grad-norm, batch-size, iteration-time (s), throughput (tokens/s),
//   tflops (per rank), mfu, skipped-iterations (the run's total so far), mem-peak-bytes/<category>;
//   with mixture-of-experts layers load_balancing_loss and z_loss (means over the layers) and per
//   layer L moe/load_balancing_loss_layer_L, moe/z_loss_layer_L, moe/dropped_tokens_layer_L,
//   moe/max_over_mean_load_layer_L and moe/tokens_per_expert_layer_L/expert_E.
// Each is written twice: at the iteration, and as "<name> vs samples" at the consumed samples.
std::vector<Scalar> tensorboard_scalars(const StepRecord& m);
// lm loss validation, lm loss validation ppl (and their "vs samples" twins).
std::vector<Scalar> tensorboard_scalars(const EvalRecord& e);
// A downstream task's figures as TASK/METRIC (hellaswag/acc, hellaswag/acc_norm, ...).
std::vector<Scalar> tensorboard_scalars(const TaskRecord& r);

class MetricsLog {
 public:
  // Opens RUN_DIR/metrics.jsonl for appending (resumed runs continue the file) and, when
  // `tensorboard_dir` is not empty, a new TensorBoard event file there.
  explicit MetricsLog(const std::string& run_dir, const std::string& tensorboard_dir = "");
  ~MetricsLog();
  // Writes the record (train/run_files.h), its TensorBoard scalars and the console line (with the
  // ETA to step `steps`); flushes both files (a killed run keeps what it logged).
  void log_step(const StepRecord& m, int64_t steps);
  // An evaluation's record and its TensorBoard scalars.
  void log_eval(const EvalRecord& e);
  // A downstream task's record and its TensorBoard scalars.
  void log_task(const TaskRecord& t);
  void log_json(const nlohmann::json& j);  // any other record
  const TensorBoardWriter* tensorboard() const { return tensorboard_.get(); }

 private:
  void write_scalars(int64_t step, int64_t samples, const std::vector<Scalar>& scalars);

  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace tripod
