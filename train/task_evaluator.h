// Scoring downstream tasks (train/tasks.h) with the training model: every request's
// log-likelihood (minus the sum of its scored tokens' losses) from a forward-only pass through the
// pipeline, as train/evaluator does for the validation loss, on any grid.
//
// Requests are batched into micro-batches of at most micro_batch_size * seq_len tokens (the
// training micro-batch's, so memory is what training plans): the requests of one example (its
// choices) go together where they fit, examples longest first so that a micro-batch's rows have
// similar lengths and little padding. Rows are padded on the right to the micro-batch's length (a
// multiple of 8, and of 2 cp under context parallelism; with rows of padding where sequence
// parallelism needs B T / cp to divide by tp), which causal attention does not let change the
// real tokens' losses. Micro-batch i runs on DP rank i % dp; each DP replica runs its
// micro-batches in rounds of the training step's count through the forward-only schedule. The
// head's TP rank 0 (every CP rank for its chunks) sums the losses in f64 and one world all-reduce
// gives every rank every request's log-likelihood. The plan does not depend on dp, so every DP
// layout computes the same rows the same way: the same bits.
//
// On the CPU, where a row's GEMMs already run at full speed and batching rows gains nothing, a
// grid with the whole model on each TP group (pp = cp = 1, every expert local, dropless, not FP8)
// scores each example by work not done twice instead: the prefix its requests share (a multiple
// choice's context) runs once through the KV cache (model/inference.h), and its continuations
// run from there as rows side by side, each token once (the per-token layers on the tokens
// alone, attention on rows padded to the longest), at most micro_batch_size x seq_len tokens of
// cache. Examples go to DP ranks in turn. The figures equal the pipeline's to f32 rounding.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/layout.h"
#include "model/gpt.h"
#include "parallel/context.h"
#include "parallel/pipeline/executor.h"
#include "train/tasks.h"

namespace tripod {

// One micro-batch of requests.
struct ScoreBatch {
  std::vector<int64_t> rows;  // indices of the requests, in row order
  int64_t B = 0;              // rows, plus rows of padding that sequence parallelism needs
  int64_t T = 0;              // the padded length of every row
};

struct BatchPlanOptions {
  int64_t max_tokens = 0;  // B * T at most (one row of up to seq_len always fits)
  int64_t seq_len = 0;
  int64_t granule = 1;     // T is a multiple of it (2 cp under context parallelism; divides seq_len)
  int64_t split = 1;       // B * T is a multiple of it (tp cp under sequence parallelism: B T / cp splits over tp)
  bool batch = true;       // false: one request per micro-batch (the benchmark's baseline)
};

// The micro-batches scoring `requests` (ordered by example, as load_task builds them), longest
// first. A pure function: the same plan on every rank and every grid with the same granules.
std::vector<ScoreBatch> plan_score_batches(std::span<const ScoreRequest> requests, const BatchPlanOptions& o);

class TaskEvaluator {
 public:
  // As Evaluator: `model` is this rank's part as `layout` (a forward-only layout, make_eval_layout)
  // places it; the rows run in rounds of its micro-batch count, each through a forward-only
  // schedule of that many micro-batches.
  // `reg` holds `model`'s parameters (the shared-prefix path reads them through the KV cache).
  TaskEvaluator(const Config& cfg, const RankLayout& layout, Ops& ops, ParallelContext& par, GptModel& model,
                ParamRegistry& reg);

  // Every request's log-likelihood, on every rank. Collective over the world. `progress` names
  // what is scored in the progress line (logged by rank 0 every 10 s), `examples` how many
  // examples the requests are. `batch` = false: one request per micro-batch through the pipeline
  // (the benchmark's baseline), never the shared prefixes.
  std::vector<double> loglikelihoods(std::span<const ScoreRequest> requests, const std::string& progress = "",
                                     int64_t examples = 0, bool batch = true);
  // A task's figures (TaskResult::seconds: its wall time). Collective.
  TaskResult evaluate(const Task& task);

 private:
  PipelineExecutor& executor(int microbatches);
  // Whether an example's requests share their prefix through the KV cache (see the header).
  bool shares_prefixes() const;
  std::vector<double> shared_prefix_loglikelihoods(std::span<const ScoreRequest> requests, const std::string& progress,
                                                   int64_t examples);
  // Every rank's sums of scored losses added up over the world, negated: the log-likelihoods.
  std::vector<double> world_loglikelihoods(const std::vector<double>& losses);

  Config cfg_;
  RankLayout layout_;
  Ops& ops_;
  ParallelContext& par_;
  GptModel& model_;
  ParamRegistry& reg_;
  std::map<int, std::unique_ptr<PipelineExecutor>> executors_;  // by micro-batches per run
};

// Every task of `cfgs` read and tokenized with data.tokenizer for a model of `cfg`: the start-up
// of `tripod eval --task` and of a training run with [eval] tasks. InputError naming the file,
// line and field (or data.tokenizer when there is none); `where(i)` names where task i was given.
std::vector<Task> load_tasks(const Config& cfg, const std::vector<EvalTaskConfig>& cfgs,
                             const std::function<std::string(size_t)>& where);

}  // namespace tripod
