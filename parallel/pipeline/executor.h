// Runs one pipeline rank's actions for a training step: posts the receives and sends of
// activations (forward) and gradients (backward) between neighbouring virtual stages through the
// pipeline communicator, keeps the tensors in flight per action, and calls the model through
// callbacks. It runs exactly the plan the simulator checked (parallel/pipeline/plan.h has the
// rules), so every schedule the validator accepts runs without deadlock.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/pipeline/plan.h"
#include "parallel/pipeline/trace.h"

namespace tripod {

struct PipelineCallbacks {
  // Runs local chunk `chunk` forward on micro-batch `mb`. `input` is the activation entering the
  // chunk's virtual stage (undefined on stage 0, which reads its own data). Returns the chunk's
  // output, which must be defined except on the last virtual stage.
  std::function<Tensor(int mb, int chunk, const Tensor& input)> forward;
  // Runs it backward (B): `grad_output` is the gradient of the chunk's output (undefined on the
  // last virtual stage, which starts from its loss). Returns the gradient of its input, which must
  // be defined except on virtual stage 0.
  std::function<Tensor(int mb, int chunk, const Tensor& grad_output)> backward;
  // A split backward (schedules with I and W actions): backward_input (I) takes and returns what
  // backward does and keeps what the weight gradients need; backward_weight (W) computes them.
  // Needed only when the schedule has I or W actions.
  std::function<Tensor(int mb, int chunk, const Tensor& grad_output)> backward_input;
  std::function<void(int mb, int chunk)> backward_weight;
  // An (uninitialised) tensor of the right shape, dtype and device to receive into: the
  // activation entering (mb, chunk) (grad = false) or the gradient of its output (grad = true).
  std::function<Tensor(int mb, int chunk, bool grad)> recv_buffer;
  // Optional: called once per chunk right after its last weight-gradient action (B or W) of the
  // step (and after a B's gradient has been handed to the send), when the chunk's gradients are
  // final.
  std::function<void(int chunk)> chunk_done;
};

class PipelineExecutor {
 public:
  // Validates `schedule` (InputError naming the first problem) and plans rank `pp_rank`'s part.
  // `pp` is the pipeline communicator (size schedule.pp; may be null when pp == 1), `trace` an
  // optional recorder of each compute, send and receive, `flight` the optional flight recorder,
  // told the action each communication belongs to (a message: the action that produced a send,
  // the action that consumes a receive).
  PipelineExecutor(Schedule schedule, Communicator* pp, int pp_rank, TraceRecorder* trace = nullptr,
                   FlightRecorder* flight = nullptr);

  // Runs this rank's actions once. Returns when every action has run and every send of this
  // rank has completed.
  void run(const PipelineCallbacks& cb);

  const Schedule& schedule() const { return schedule_; }
  const PipePlan& plan() const { return plan_; }
  int pp_rank() const { return rank_; }
  // Position in this rank's list of the last weight-gradient action (B or W) of `chunk`, after
  // which its gradients are final (and chunk_done runs).
  int last_backward(int chunk) const { return plan_.last_backward[rank_][chunk]; }
  // Whether `a` (a B or W) is that last action of its chunk: the callback can hand the model its
  // per-layer "gradients final" hook exactly then.
  bool is_last_backward(const Action& a) const { return schedule_.ranks[rank_][last_backward(a.chunk)] == a; }
  bool is_last_backward(int mb, int chunk) const { return is_last_backward(B(mb, chunk)); }

  // Tensors the executor holds now / held at most during the last run: receive buffers, inputs
  // handed over between chunks on this rank, results whose sends are not yet known complete.
  // The peak equals plan_peak_buffers() for this rank.
  int held() const { return held_; }
  int peak_held() const { return peak_held_; }

 private:
  void post_recv(int msg, const PipelineCallbacks& cb);
  void wait_recv(int msg);
  void compute(int index, const PipelineCallbacks& cb);
  void post_send(int msg, const PipelineCallbacks& cb);
  void wait_send(int msg);
  void hold(int delta);
  bool tracing() const { return trace_ && trace_->enabled(); }

  Schedule schedule_;
  PipePlan plan_;
  Communicator* pp_;
  int rank_;
  TraceRecorder* trace_;
  FlightRecorder* flight_;
  std::vector<int> local_next_;  // per action: the action on this rank taking its result, or -1
  bool has_split_ = false;       // the schedule has I and W actions on this rank

  // Per step state.
  struct InFlight {
    std::unique_ptr<CommRequest> req;
    Tensor tensor;
  };
  std::vector<InFlight> recvs_, sends_;  // by message id
  std::vector<Tensor> inputs_;           // per action: its input once received or handed over
  Tensor result_;                        // the last action's result, until its send is posted
  int held_ = 0, peak_held_ = 0;
};

}  // namespace tripod
