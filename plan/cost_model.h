// The planner's cost model: the time of every pipeline action of a training step (forward or
// backward of one model chunk for one micro-batch) from the layers' GEMM shapes, attention,
// memory-bound ops and the chunk's tensor-parallel collectives (with recomputation), timed on a
// Hardware; then the real schedule run by the pipeline simulator with those times, the DP
// gradient reduction as tripod buckets it, the embedding sync and the optimizer step. Memory is
// tripod's exact plan (train/memory_plan) plus the documented overheads. DESIGN.md ("Planner")
// lists every assumption.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/op_timing.h"
#include "plan/hardware.h"
#include "config/config.h"
#include "config/memory_plan.h"
#include "parallel/pipeline/plan.h"

namespace tripod {

// Times of one chunk's actions for one micro-batch, and of each direction by kind (`f`, `b`:
// GEMMs, attention, the memory-bound ops, TP and CP collectives; forward == f.total(), backward
// == b.total()). `weight` is the part of `backward` that a split backward runs as W: the
// weight-gradient GEMMs (dW = dY^T X) of the chunk's layers and of the head, and the embedding
// table's gradient; I is backward - weight (the input-gradient GEMMs, attention, norms,
// recomputation, collectives).
struct ChunkTimes {
  struct Split {
    double gemm = 0, attention = 0, elementwise = 0, comm = 0;
    double total() const { return gemm + attention + elementwise + comm; }
    Split& operator+=(const Split& o) {
      gemm += o.gemm;
      attention += o.attention;
      elementwise += o.elementwise;
      comm += o.comm;
      return *this;
    }
  };
  double forward = 0, backward = 0, weight = 0;
  Split f, b;
  double input() const { return backward - weight; }
};

struct StepPrediction {
  double step_time_s = 0;
  double pipeline_s = 0;        // the simulated schedule's makespan
  double bubble = 0;            // the simulator's idle fraction, mean over pipeline ranks
  double exposed_comm = 0;      // share of the step spent in communication nothing overlaps
  double dp_exposed_s = 0;      // DP reduction (and embedding sync) past the end of the backward
  double optimizer_s = 0;       // grad norm, AdamW, distributed-optimizer all-gather
  double p2p_s = 0;             // one stage-to-stage message
  double tokens_per_s = 0;
  double model_tflops_per_gpu = 0;  // llm.c's 6N + 6LCT FLOPs per token, as the trainer reports
  double mfu = 0;
  std::vector<ChunkTimes> stages;   // per virtual stage
  // The step by where its time goes (kernels/op_timing.h: GEMMs, attention, memory-bound ops,
  // exposed communication, pipeline idle, optimizer) on each pipeline rank (its tp, cp and dp
  // ranks alike) and the mean over them: what `tripod plan --check` compares with a run.
  std::vector<StepBreakdown> ranks;
  StepBreakdown breakdown;
  // Memory of the largest rank: tripod's plan, plus the overheads below.
  RankMemory memory;
  int64_t workspace_bytes = 0;      // one layer's activation gradients during its backward
  int64_t comm_bytes = 0;           // DP buckets in flight
  int64_t reserved_bytes = 0;       // the hardware file's reserved_gib (context, library workspaces)
  int64_t memory_bytes() const { return memory.total() + workspace_bytes + comm_bytes + reserved_bytes; }
};

// `cfg` must have passed validate_layout() for tp*pp*dp ranks; the ranks fill nodes of
// hw.gpus_per_node in tripod's order (tp fastest, then dp, then pp).
StepPrediction predict_step(const Config& cfg, const Hardware& hw);
// The same with the config's schedule (make_schedule) and its plan already built: the planner
// shares them between the layouts of one pipeline shape.
StepPrediction predict_step(const Config& cfg, const Hardware& hw, const Schedule& schedule, const PipePlan& plan);

// The per-stage action times alone (no memory plan, no simulation), for the config's layer split
// (which must be resolved: see balance_stages) or for `layers` per virtual stage.
std::vector<ChunkTimes> stage_times(const Config& cfg, const Hardware& hw);
std::vector<ChunkTimes> stage_times(const Config& cfg, const Hardware& hw, const std::vector<int>& layers);

// parallel.layers_per_stage = "auto": layer counts per virtual stage (pp*vp entries, each >= 1,
// adding up to model.n_layers) whose largest predicted stage cost, forward + backward of one
// micro-batch (embedding, final norm, head and loss included, recomputation and TP collectives
// too), is the least any split reaches. Among the splits reaching it, layers are taken off the
// costliest stages first. The costs depend on the layout (tp, cp, sequence parallelism,
// micro-batch, recomputation), not on the schedule or placement.
std::vector<int> balanced_layers_per_stage(const Config& cfg, const Hardware& hw);
// Resolves parallel.layers_per_stage = "auto" of a config that passed validate_layout() into
// explicit counts (balanced_layers_per_stage); other configs are left as they are.
void balance_stages(Config& cfg, const Hardware& hw);
// The hardware a training run balances its stages with: parallel.hardware, or the built-in
// datasheet figures for train.device (an H100 SXM for cuda, a generic 16-core CPU for cpu).
Hardware balance_hardware(const Config& cfg);
// What a command does with a config that passed validate_layout(): balance_stages with
// balance_hardware(cfg) when the split is "auto". Returns the split as one line for the log and
// --dry-run ("layers per virtual stage: 9+7 (auto on H100 ...: predicted F+B 1.2+1.2 ms)").
std::string resolve_layer_split(Config& cfg);

}  // namespace tripod
