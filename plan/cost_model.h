// The planner's cost model: the time of every pipeline action of a training step (forward or
// backward of one model chunk for one micro-batch) from the layers' GEMM shapes, attention,
// memory-bound ops and the chunk's tensor-parallel collectives (with recomputation), timed on a
// Hardware; then the real schedule run by the pipeline simulator with those times, the DP
// gradient reduction as tripod buckets it, the embedding sync and the optimizer step. Memory is
// tripod's exact plan (train/memory_plan) plus the documented overheads. DESIGN.md ("Planner")
// lists every assumption.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/hardware.h"
#include "config/config.h"
#include "config/memory_plan.h"

namespace tripod {

// Times of one chunk's actions for one micro-batch; *_comm is the part spent in TP collectives.
struct ChunkTimes {
  double forward = 0, backward = 0;
  double forward_comm = 0, backward_comm = 0;
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

// The per-stage action times alone (no memory plan, no simulation).
std::vector<ChunkTimes> stage_times(const Config& cfg, const Hardware& hw);

}  // namespace tripod
