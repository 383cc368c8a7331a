// Simulating a pipeline schedule without any compute: a timeline of its plan
// (parallel/pipeline/plan.h, whose rules it models) from per-action costs: bubble, peak in-flight
// activations.
#pragma once

#include <vector>

#include "parallel/pipeline/plan.h"

namespace tripod {

// Time units per action (each chunk's forward or backward) and per message.
struct PipeCosts {
  double forward = 1, backward = 2, comm = 0;
};
// Per-virtual-stage action times (one entry per stage, pp * vp), replacing PipeCosts' forward
// and backward: the planner's cost model times each chunk, first and last stages included.
struct StageCosts {
  std::vector<double> forward, backward;
};

struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

struct RankSimulation {
  std::vector<TimedAction> timeline;  // in list order
  double busy = 0;                    // compute time
  double bubble = 0;                  // idle fraction: 1 - busy / makespan
  // Peak number of (micro-batch, chunk) pairs whose activations are held (forward started,
  // backward not finished), over the rank and per local chunk. In units of one chunk's
  // activations for one micro-batch, i.e. 1/vp of a whole stage's.
  int peak_inflight = 0;
  std::vector<int> peak_inflight_per_chunk;
};

struct Simulation {
  double makespan = 0;  // from 0 to the end of the last action on any rank
  std::vector<RankSimulation> ranks;
  double bubble = 0;      // mean of the ranks' bubble fractions
  int peak_inflight = 0;  // max over ranks
};

// Bubble fraction of a rank = its idle time / makespan = 1 - busy/makespan, the fraction of the
// pipeline's step during which the rank computes nothing (Narayanan et al. 2021 count the same
// idle time; their "bubble time fraction" divides it by the ideal time instead). With forward f,
// backward b, free communication and m micro-batches it is (p-1)/(m+p-1) for GPipe and 1F1B and
// (p-1)/(v*m+p-1) for interleaved 1F1B.
Simulation simulate(const Schedule& schedule, const PipeCosts& costs);
Simulation simulate(const Schedule& schedule, const PipePlan& plan, const PipeCosts& costs);
Simulation simulate(const Schedule& schedule, const PipePlan& plan, const PipeCosts& costs, const StageCosts& stages);

}  // namespace tripod
