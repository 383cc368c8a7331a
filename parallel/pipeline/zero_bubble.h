// Zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv
// 2401.10241): the backward of each (micro-batch, chunk) is split into I (input gradient, on the
// critical path) and W (weight gradients, which can wait and fill what would be idle time).
//
//  - zb-h1 (vp = 1): at most pp micro-batches held per rank, 1F1B's peak; unit F = I = W idle per
//    rank pp-1 where 1F1B idles 3(pp-1).
//  - zb-h2 (vp = 1): up to 2pp-1 micro-batches held on rank 0 (more warm-up forwards), about
//    twice 1F1B's memory; no idle inside a rank's span (see below).
//  - zbv (V placement, vp = 2): the paper's ZB-V order: at most 2pp chunk-activations held per
//    rank, 1F1B's memory, and no idle in the overlapped accounting once m >= 2pp (unit costs).
//    Its ranks consume some messages of a peer in another order than the peer sends them, which
//    the executor allows (plan.h: receives are posted in sending order, consumed in any).
//    zbv_schedule(..., eager = true), an `auto` candidate, moves each consumer up to when its
//    message is first in line (fifo_order): up to 3pp-1 chunk activations, less idle where F, I
//    and W differ.
//  - dualpipev (V placement, vp = 2, m >= 2pp): DeepSeek's DualPipeV, the V-shaped cut of
//    DualPipe (arXiv 2412.19437): forwards of one direction paired with backwards of the other
//    (here run one after the other: tripod has no expert all-to-all to overlap), split backwards
//    where they fill its ramp-down.
//  - auto: the best of the fixed schedules and of list schedules built for the given per-stage
//    F, I and W times under a memory cap (see auto_schedule).
//
// Idle, with unit costs F = I = W = 1 and free communication (Simulation's figures):
//   1F1B idle per rank = makespan - busy = 3(pp-1).
//   zb-h1: idle per rank pp-1 (m >= pp).
//   zb-h2, zbv: each rank still waits for its first input (rank r: r time units) and the last
//   gradients travel back, so with the optimizer step synchronising the ranks idle stays > 0
//   (pp-1 per rank for zb-h2); their zero is the paper's accounting, where consecutive steps
//   overlap and the period is the longest rank span: Simulation::period - busy = 0 on every
//   rank once m >= 2pp (zb-h2 and zbv). README's table lists both figures.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/simulate.h"

namespace tripod {

// A list scheduler in the spirit of the zero-bubble paper's heuristic: it plays the step out in
// time with the given costs and, whenever a rank is free, starts the first of: the input
// gradient (B, or I when split) of the oldest micro-batch whose output gradient has arrived (the
// critical path); the next forward whose input has arrived, if the rank's memory stays within
// its cap; the oldest pending W. A rank with nothing to start waits for the next arrival. Each
// chunk's forwards and backwards go in micro-batch order, and each rank consumes the messages of
// a peer in the order they were sent, so the result always validates.
struct ListScheduleOptions {
  int pp = 1, vp = 1, microbatches = 1;
  Placement placement = Placement::Loop;
  bool split_backward = true;  // I and W; false: one B
  // Per rank: the most activation memory held (units of Simulation::peak_memory); empty: no cap.
  // Should the cap stop every rank, the forward of the earliest free one runs over it.
  std::vector<double> cap;
  double weight_memory = kWeightMemoryFraction;
  StageCosts costs;  // pp*vp entries each of forward, backward and weight; empty: F = I = W = 1
  double comm = 0;
  // Put W before a forward whose input is ready once the rank holds this many W-pending
  // micro-batches (< 0: never; W then waits until nothing else can run).
  int max_pending_w = -1;
};
Schedule list_schedule(const ListScheduleOptions& options, ScheduleKind kind);

// Makes every rank consume each peer's messages in the order the peer sends them: walking the
// lists in order, the action consuming the first waiting message moves up to just before the one
// that found it first in line. Nobody waits longer; the receiver holds that activation earlier.
// A schedule already in order is returned as it is.
Schedule fifo_order(Schedule schedule);

std::vector<Action> zb_h1_actions(int pp, int microbatches, int rank);
Schedule zb_h1_schedule(int pp, int microbatches);
Schedule zb_h2_schedule(int pp, int microbatches);
std::vector<Action> zbv_actions(int pp, int microbatches, int rank);
// The paper's order (2pp chunk activations, 1F1B's memory; with unit costs no overlapped idle
// once m >= 2pp); eager: fifo_order of it (up to 3pp-1 chunk activations).
Schedule zbv_schedule(int pp, int microbatches, bool eager = false);
// DualPipeV, rank `rank`'s list; needs microbatches >= 2*pp.
std::vector<Action> dualpipev_actions(int pp, int microbatches, int rank);
Schedule dualpipev_schedule(int pp, int microbatches);

struct AutoCandidate {
  std::string name;  // "1f1b", "zb-h1", "list cap=8", ...
  double makespan = 0, peak_memory = 0;
  bool fits = false;  // peak memory within the cap
};
struct AutoSchedule {
  Schedule schedule;  // kind "auto"
  std::string chosen;  // the candidate it is
  std::vector<AutoCandidate> candidates;
};
// schedule = "auto": for pp ranks, vp chunks per rank placed by `placement`, m micro-batches,
// per-stage times `costs` (forward, backward and weight; see StageCosts) and `comm` per message,
// the schedule with the shortest simulated makespan whose peak activation memory on every rank
// is at most `cap` (units of Simulation::peak_memory; <= 0: what 1F1B holds, pp*vp chunk
// activations). Candidates: every fixed schedule these numbers allow, and list schedules built
// for these costs with caps from 1F1B's memory up to `cap`, with and without split backwards.
// Since the fixed schedules are candidates it is never worse than the best of them that fits.
// InputError when nothing fits the cap.
AutoSchedule auto_schedule(int pp, int vp, Placement placement, int microbatches, const StageCosts& costs,
                           double comm, double cap, double weight_memory = kWeightMemoryFraction);

}  // namespace tripod
