// The plan of point-to-point operations each pipeline rank makes in one step, what
// PipelineExecutor runs: built from a schedule, which it validates (dependencies, message order,
// deadlocks). parallel/pipeline/simulate.h times the same plan.
//
// Point-to-point semantics (what PipelineExecutor does, and what simulate() models exactly):
//  - Each rank runs its actions one at a time in list order.
//  - Action i's input (the activation entering its virtual stage for F, the gradient of its
//    output for B or I; W has none) arrives from the neighbouring stage's rank, or is handed over in memory when
//    that stage is on the same rank. The receive for action i is posted (non-blocking) when
//    action i-1 starts, so one receive is always in flight ahead; the rank blocks only in the
//    wait just before action i.
//  - After an action, its result (F: the output, to stage s+1; B or I: the input gradient, to
//    stage s-1; W: nothing) is sent with a non-blocking send; the rank does not wait for it there.
//  - A send is waited on (its buffer freed) as soon as the sender has received a message that
//    the receiver sent after consuming it, so such a wait never blocks on the peer; the sends
//    left are waited on after the rank's last action.
//  - A message is named by (micro-batch, receiving stage, direction), and a rank may consume the
//    messages of a peer in any order. Receives from one peer are posted in the order the peer
//    sends (NCCL matches a pair's messages in posting order; the MPI tags name the message too):
//    before the receive of action i is posted, every earlier message of the same sender not yet
//    posted is (its buffer held from then on).
//  - A message is in flight for `comm` time units from when both its send and its receive have
//    been posted.
// Under these rules a rank can block only in a receive wait, so a schedule deadlocks exactly
// when the ranks' orders and the data dependencies form a cycle; the validator finds and names
// such a cycle.
#pragma once

#include <cstdint>
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
  // Per rank: the position of the last B or W of each chunk (its weight gradients are final then).
  std::vector<std::vector<int>> last_backward;
};

// Validates `schedule` and builds its plan. Throws InputError naming the first problem: a
// malformed list ("rank 1: F2.0 appears twice", "rank 0: B3.1 is missing", "rank 0: B3.1 and
// I3.1: ..."), a dependency broken on one rank ("rank 1: B2.0 before F2.0", "rank 1: W2.0 before
// I2.0", "rank 1: I2.0 without F2.0"), or a deadlock cycle across ranks. The rules for split
// backwards: per (micro-batch, chunk) exactly one F and either one B or one I and one W; I (like
// B) after its F and after the input gradient of the next stage; W after its I.
PipePlan plan_pipeline(const Schedule& schedule);
inline void validate_schedule(const Schedule& schedule) { (void)plan_pipeline(schedule); }

// The most tensors the executor holds at once on `rank` under `plan`: receive buffers posted or
// waiting for their action, inputs handed over in memory, results not yet known delivered.
int plan_peak_buffers(const PipePlan& plan, const Schedule& schedule, int rank);

}  // namespace tripod
