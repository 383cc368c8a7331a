// RankLayout: everything the config, the world size and a rank imply for that rank, computed once
// by a pure function and read by whatever needs it (the trainer, the evaluator, the memory plan,
// the planner's cost model, the commands and the benches). Nothing else re-derives these facts.
//
// Worked example, 8 ranks, tp=2 dp=2 pp=2, vp=2, 8 layers, micro-batch 2, global batch 16:
// rank 5 has coords (tp=1, dp=0, pp=1); 16 / (2 * 2) = 4 micro-batches per step; the interleaved
// schedule over pp=2, vp=2; layers per virtual stage [2, 2, 2, 2]; its chunks are virtual stages
// 1 (layers 2-3) and 3 (layers 6-7, the head), so it reads targets but not tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/gpt.h"
#include "parallel/data_parallel/grad_sync.h"
#include "parallel/grid.h"
#include "parallel/pipeline/plan.h"
#include "parallel/pipeline/zero_bubble.h"

namespace tripod {

class ParamRegistry;
struct Param;

struct RankLayout {
  RankGrid grid;
  int rank = 0;
  Coords coords;
  bool sequence_parallel = false;

  // Batch: micro-batches of `micro_batch_size` samples, `microbatches` of them per rank and step.
  int micro_batch_size = 1;
  int microbatches = 1;         // train.global_batch_size / (micro_batch_size * dp)
  int64_t micro_tokens = 0;     // N = micro_batch_size * seq_len / cp: this rank's tokens of a micro-batch
  int64_t local_tokens = 0;     // Ns: this rank's slice of N between TP regions (N / tp under SP)

  // Pipeline: the training schedule (validated) and its plan; the layers of every virtual stage
  // and this rank's chunks in local order; whether a chunk here holds the embedding (the rank
  // reads input tokens) or the head (it reads targets and computes the loss).
  Schedule schedule;
  PipePlan plan;
  std::vector<int> stage_layers;  // pp*vp entries
  std::vector<ChunkLayout> chunks;
  bool has_embedding = false, has_head = false;

  // Gradients: the rank's parameter elements (the flat buffers' size, alignment included) and how
  // they are synchronised (the reduce group, its buckets and the ranges this rank's optimizer
  // updates, the tied table's sum between the pipeline's ends).
  int64_t flat_elements = 0;
  int64_t buffer_elements = 0;  // f32 buffers (a router's selection bias), not in the flat buffers
  GradSync grad_sync;
};

// The layout of `rank` for `cfg`, which must have passed validate_layout() (the grid is
// cfg.parallel's) and whose layer split is resolved, under `schedule` (make_schedule's, or the one
// the run resolved: a schedule = "auto" is chosen before the layout is made); the plan is built
// when not given (the planner shares one between the layouts of a pipeline shape). Throws
// InputError when the schedule does not fit the config or the layer split is invalid. The result
// is a value nothing changes afterwards.
RankLayout make_rank_layout(const Config& cfg, int rank, const Schedule& schedule);
RankLayout make_rank_layout(const Config& cfg, int rank, const Schedule& schedule, const PipePlan& plan);
// make_rank_layout(cfg, rank, make_schedule(cfg)): a fixed schedule, or "auto" for unit costs.
RankLayout make_rank_layout(const Config& cfg, int rank);

// The layout of a forward-only run (tripod eval, and the trainer's evaluation): `train`'s, with
// the forward-only schedule over the same micro-batches, pp, vp and placement.
RankLayout make_eval_layout(const RankLayout& train);
// make_eval_layout of the config's own layout; parallel.schedule and schedule_file are not read.
RankLayout make_eval_layout(const Config& cfg, int rank);

// The run's pipeline schedule: parallel.schedule_file loaded and checked against the grid, or
// parallel.schedule built for the step's micro-batches per rank; "auto" (the one place it is
// built for a run) for the per-stage F, I and W times `auto_costs` (the start-up profile's, or
// the cost model's for --dry-run; unit costs when empty) with 1F1B's activation memory as the
// cap, the candidates going to `auto_info` when given. Throws InputError.
Schedule make_schedule(const Config& cfg, const StageCosts& auto_costs = {}, AutoSchedule* auto_info = nullptr);
// Micro-batches per rank and step: train.global_batch_size / (micro_batch_size * dp).
int microbatches_per_rank(const Config& cfg);
// The layer counts of every virtual stage (pp*vp entries): parallel.layers_per_stage, or an even
// split when it is empty. A split of "auto" must have been resolved first (balance_stages in
// plan/cost_model.h); an unresolved one is a bug of the caller.
std::vector<int> stage_layers(const Config& cfg);
// A layer split for people: "10+6"; a run of three or more equal counts as COUNTxSTAGES
// ("1x128", "3+2x14+1").
std::string split_str(const std::vector<int>& layers);
// This rank's chunks: the layer split of stage_layers(cfg).
std::vector<ChunkLayout> chunks_of(const Config& cfg, int pp_rank);

// Gradient buckets over a rank's parameters in registration order, about parallel.bucket_mb
// each; chunks never share a bucket and the tied table `wte` (synchronised between the
// pipeline's ends first) gets one of its own. With `in_group`, only the parameters it accepts,
// and no bucket spans one it refuses (each bucket is a run of the group's parameters).
std::vector<GradBucket> make_grad_buckets(const ParamRegistry& reg, const Param* wte, double bucket_mb,
                                          const std::function<bool(const Param&)>& in_group = {});

}  // namespace tripod
