// Checking and simulating a pipeline schedule without any compute: the plan of point-to-point
// operations each rank makes (what the executor runs), dependency and message-order checks,
// deadlock detection, and a timeline from per-action costs (bubble, peak in-flight activations).
//
// Point-to-point semantics (what PipelineExecutor does, and what simulate() models exactly):
//  - Each rank runs its actions one at a time in list order.
//  - Action i's input (the activation entering its virtual stage for F, the gradient of its
//    output for B) arrives from the neighbouring stage's rank, or is handed over in memory when
//    that stage is on the same rank. The receive for action i is posted (non-blocking) when
//    action i-1 starts, so one receive is always in flight ahead; the rank blocks only in the
//    wait just before action i.
//  - After an action, its result (F: the output, to stage s+1; B: the input gradient, to stage
//    s-1) is sent with a non-blocking send; the rank does not wait for it there.
//  - A send is waited on (its buffer freed) as soon as the sender has received a message that
//    the receiver sent after consuming it, so such a wait never blocks on the peer; the sends
//    left are waited on after the rank's last action.
//  - Messages between two ranks are matched in the order they are posted, as NCCL matches them
//    (the executor's MPI tags also name micro-batch, stage and direction, which agree): the
//    validator requires every receiver to consume the messages of each peer in the order that
//    peer sends them.
//  - A message is in flight for `comm` time units from when both its send and its receive have
//    been posted.
// Under these rules a rank can block only in a receive wait, so a schedule deadlocks exactly
// when the ranks' orders and the data dependencies form a cycle; the validator finds and names
// such a cycle.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/action.h"

namespace tripod {

// One point-to-point message between two ranks of the pipeline.
struct PipeMessage {
  int src_rank = 0, dst_rank = 0;
  int src_index = 0, dst_index = 0;  // positions of the producing / consuming action in their lists
  Action src, dst;                   // e.g. F3.0 on rank 0 -> F3.0 on rank 1 (its activation)
  bool grad = false;                 // a gradient (backward) rather than an activation (forward)
  int tag = 0;                       // the MPI tag: micro-batch, receiving stage and direction
};

enum class PlanOpKind : uint8_t { PostRecv, WaitRecv, Compute, PostSend, WaitSend };
struct PlanOp {
  PlanOpKind kind;
  int index;  // Compute: the action's position in the rank's list; otherwise a message id
};

// Everything a rank does in one step, in order, and the messages between ranks.
struct PipePlan {
  std::vector<PipeMessage> messages;
  std::vector<std::vector<PlanOp>> ranks;
  // Per rank and action: the message bringing its input and the message taking its result away
  // (-1 when there is none or it is handed over in memory on the same rank).
  std::vector<std::vector<int>> recv_msg, send_msg;
  // Per rank: the position of the last backward of each chunk (its gradients are final then).
  std::vector<std::vector<int>> last_backward;
};

// Validates `schedule` and builds its plan. Throws InputError naming the first problem: a
// malformed list ("rank 1: F2.0 appears twice", "rank 0: B3.1 is missing"), a dependency broken
// on one rank ("rank 1: B2.0 before F2.0"), messages consumed out of order, or a deadlock cycle
// across ranks.
PipePlan plan_pipeline(const Schedule& schedule);
inline void validate_schedule(const Schedule& schedule) { (void)plan_pipeline(schedule); }

// The most tensors the executor holds at once on `rank` under `plan`: receive buffers posted or
// waiting for their action, inputs handed over in memory, results not yet known delivered.
int plan_peak_buffers(const PipePlan& plan, const Schedule& schedule, int rank);

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
