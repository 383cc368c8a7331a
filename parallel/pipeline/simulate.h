// Simulating a pipeline schedule without any compute: a timeline of its plan
// (parallel/pipeline/plan.h, whose rules it models) from per-action costs: bubble, peak in-flight
// activations.
#pragma once

#include <vector>

#include "parallel/pipeline/plan.h"

namespace tripod {

// What a micro-batch's chunk holds between its I and its W, as a fraction of what its F keeps.
// W needs, per weight GEMM, the GEMM's input and its output gradient. In tripod's blocks (GPT-2's
// and Llama's alike) these add up to what the forward kept: e.g. GPT-2 keeps 16 d_model-sized
// tensors per token and layer (the two norm outputs, q k v, the attention output, the residual,
// the MLP before and after its GELU, the block input), and W needs 7 GEMM inputs (the two norm
// outputs, the attention output, the GELU output: 1+1+1+4) and 9 output gradients (qkv, the
// projection, fc1, fc2: 3+1+4+1). So the state does not shrink at I: a micro-batch holds one unit
// from the start of its F to the end of its W (or B).
inline constexpr double kWeightMemoryFraction = 1.0;

// Time units per action and per message. A backward is split into I and W for the schedules
// that do so: I takes backward - weight, W takes weight (B = I + W).
struct PipeCosts {
  double forward = 1, backward = 2, comm = 0;
  double weight = -1;  // W's time; < 0: half the backward
  double weight_memory = kWeightMemoryFraction;  // held between I and W, per unit F holds
  double w() const { return weight < 0 ? backward / 2 : weight; }
  double i() const { return backward - w(); }
};
// Per-virtual-stage action times (one entry per stage, pp * vp), replacing PipeCosts' forward
// and backward: the planner's cost model times each chunk, first and last stages included.
// `weight` (optional) is each stage's W time, I taking backward - weight; without it I and W
// take half the stage's backward each, or PipeCosts::weight's split when that is set.
struct StageCosts {
  std::vector<double> forward, backward, weight;
};
// F, I and W times per stage (B = I + W), as `tripod schedule --costs` and the auto schedule take
// them: one entry each (every stage the same) or pp*vp.
StageCosts stage_costs_fiw(const std::vector<double>& f, const std::vector<double>& i, const std::vector<double>& w,
                           int num_stages);
// The time of action `a` on virtual stage `stage`.
double action_time(const PipeCosts& costs, const StageCosts& stages, const Action& a, int stage);

struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

struct RankSimulation {
  std::vector<TimedAction> timeline;  // in list order
  double busy = 0;                    // compute time
  double idle = 0;                    // makespan - busy
  double bubble = 0;                  // idle fraction: 1 - busy / makespan
  // From the start of the rank's first action to the end of its last, and the idle time within
  // it, measured against the pipeline's period (see Simulation::period).
  double span = 0, overlapped_idle = 0;
  // Peak number of (micro-batch, chunk) pairs whose activations are held (forward started, B or
  // W not finished), over the rank and per local chunk. In units of one chunk's activations for
  // one micro-batch, i.e. 1/vp of a whole stage's.
  int peak_inflight = 0;
  std::vector<int> peak_inflight_per_chunk;
  // Peak activation memory in the same units: 1 per pair from the start of its F to the end of
  // its I (or B), then PipeCosts::weight_memory until the end of its W. Equals peak_inflight
  // when weight_memory is 1 or the schedule has no split backwards.
  double peak_memory = 0;
};

struct Simulation {
  double makespan = 0;  // from 0 to the end of the last action on any rank
  std::vector<RankSimulation> ranks;
  double bubble = 0;      // mean of the ranks' bubble fractions
  int peak_inflight = 0;  // max over ranks
  double peak_memory = 0;  // max over ranks
  // The longest rank span: the step time when consecutive steps overlap, each rank starting its
  // next step as soon as it has finished this one (no synchronisation of the pipeline ranks at
  // the optimizer step; the zero-bubble paper's accounting, whose ZB-H2 and ZB-V reach 0 idle).
  // A rank's overlapped_idle = period - busy. tripod synchronises the ranks at the optimizer step
  // (gradient clipping's global norm), so its step time is the makespan.
  double period = 0;
};

// Bubble fraction of a rank = its idle time / makespan = 1 - busy/makespan, the fraction of the
// pipeline's step during which the rank computes nothing (Narayanan et al. 2021 count the same
// idle time; their "bubble time fraction" divides it by the ideal time instead). With forward f,
// backward b, free communication and m micro-batches it is (p-1)/(m+p-1) for GPipe and 1F1B and
// (p-1)/(v*m+p-1) for interleaved 1F1B. With unit F, I and W (B = 2), idle per rank is 3(p-1)
// for 1F1B and p-1 for ZB-H1; see schedules.h for the zero-bubble schedules' figures.
Simulation simulate(const Schedule& schedule, const PipeCosts& costs);
Simulation simulate(const Schedule& schedule, const PipePlan& plan, const PipeCosts& costs);
Simulation simulate(const Schedule& schedule, const PipePlan& plan, const PipeCosts& costs, const StageCosts& stages);

}  // namespace tripod
