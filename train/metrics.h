// Step metrics: a progress line on the console, one JSON object per logged step in
// RUN_DIR/metrics.jsonl and, with train.tensorboard_dir, the same numbers as TensorBoard scalars
// (written by world rank 0, which holds every logged number: the loss and grad norm are world sums).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "train/straggler.h"
#include "train/tasks.h"
#include "train/tensorboard.h"

namespace tripod {

// One mixture-of-experts layer's step, over the whole batch (train/trainer.cpp).
struct MoeLayerMetrics {
  int layer = 0;
  std::vector<double> tokens_per_expert;  // (token, choice) pairs routed to each expert
  double dropped = 0;                     // pairs past an expert's capacity
  double load_balancing_loss = 0;         // E sum_e f_e P_e, the mean over the micro-batches
  double z_loss = 0;                      // mean logsumexp(logits)^2, the mean over the micro-batches
  // The busiest expert's load over the mean (1: balanced).
  double max_over_mean() const;
};

struct StepMetrics {
  int64_t step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double step_time_s = 0, tokens_per_s = 0, mfu = 0;
  double tflops = 0;  // model TFLOP/s per rank (the whole run's over the world size)
  int64_t batch_size = 0;  // sequences per step (train.global_batch_size)
  int64_t consumed_samples = 0;
  bool skipped = false;  // non-finite loss or grad norm: the update was skipped
  int64_t skipped_total = 0;
  nlohmann::json memory;  // peak bytes per category (per rank when gathered)
  std::optional<StragglerSummary> stragglers;  // at the end of a log interval (train.straggler_factor)
  std::vector<MoeLayerMetrics> moe;            // mixture-of-experts layers, by layer
};

struct EvalMetrics {
  int64_t step = 0, consumed_samples = 0;
  double loss = 0, perplexity = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

// The TensorBoard scalars of a step record, under Megatron-LM's names where it has one:
//   lm loss, learning-rate, grad-norm, batch-size, iteration-time (s), throughput (tokens/s),
//   tflops (per rank), mfu, skipped-iterations (the run's total so far), mem-peak-bytes/<category>;
//   with mixture-of-experts layers load_balancing_loss and z_loss (means over the layers) and per
//   layer L moe/load_balancing_loss_layer_L, moe/z_loss_layer_L, moe/dropped_tokens_layer_L,
//   moe/max_over_mean_load_layer_L and moe/tokens_per_expert_layer_L/expert_E.
// Each is written twice: at the iteration, and as "<name> vs samples" at the consumed samples.
std::vector<Scalar> tensorboard_scalars(const StepMetrics& m);
// lm loss validation, lm loss validation ppl (and their "vs samples" twins).
std::vector<Scalar> tensorboard_scalars(const EvalMetrics& e);
// A downstream task's figures as TASK/METRIC (hellaswag/acc, hellaswag/acc_norm, ...).
std::vector<Scalar> tensorboard_scalars(const TaskResult& r);

class MetricsLog {
 public:
  // Opens RUN_DIR/metrics.jsonl for appending (resumed runs continue the file) and, when
  // `tensorboard_dir` is not empty, a new TensorBoard event file there.
  explicit MetricsLog(const std::string& run_dir, const std::string& tensorboard_dir = "");
  ~MetricsLog();
  // Writes the record and the console line; flushes both files (a killed run keeps what it logged).
  void log_step(const StepMetrics& m);
  // An evaluation: the record {"eval":true,"split":"valid",...} and its TensorBoard scalars.
  void log_eval(const EvalMetrics& e);
  // A downstream task's figures: {"eval_task":true,"step","consumed_samples","task","kind",
  // "examples","eval_time_s",<metric>,<metric>_stderr} and its TensorBoard scalars.
  void log_task(int64_t step, int64_t consumed_samples, const TaskResult& r);
  void log_json(const nlohmann::json& j);  // any other record
  const TensorBoardWriter* tensorboard() const { return tensorboard_.get(); }

 private:
  void write_scalars(int64_t step, int64_t samples, const std::vector<Scalar>& scalars);

  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace tripod
