// The event-driven run of a pipeline plan, shared by plan_pipeline (deadlocks, where send waits
// can move up) and simulate (the timeline). Internal to parallel/pipeline.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "parallel/pipeline/simulate.h"

namespace tripod {

// Runs the plan of every rank under the rules in plan.h. Event driven: a rank runs until it
// must wait for a message not yet sent (or, in a final send wait, not yet posted for receipt).
struct PlanRun {
  std::vector<size_t> pc;                          // next op per rank
  std::vector<std::vector<double>> start, end;     // per rank and action
  // Send waits that can move up (find_releases): per rank, (position of a receive wait, message):
  // after that wait the rank knows the message's receiver has already consumed it.
  std::vector<std::vector<std::pair<size_t, int>>> releases;
  bool finished = true;
};

// `stages`, when given, times each virtual stage's actions instead of costs.forward/backward.
PlanRun run_plan(const Schedule& s, const PipePlan& plan, const PipeCosts& costs, bool find_releases,
                 const StageCosts& stages = {});

}  // namespace tripod
