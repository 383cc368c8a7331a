// The pipeline executor: a loop over this rank's plan (receive, compute, send), calling the
// model's forward and backward through callbacks.
#include "parallel/pipeline/executor.h"

#include "core/error.h"

namespace tripod {

PipelineExecutor::PipelineExecutor(Schedule schedule, Communicator* pp, int pp_rank, TraceRecorder* trace,
                                   FlightRecorder* flight)
    : schedule_(std::move(schedule)), plan_(plan_pipeline(schedule_)), pp_(pp), rank_(pp_rank), trace_(trace),
      flight_(flight) {
  TRIPOD_CHECK(rank_ >= 0 && rank_ < schedule_.pp, "pipeline rank {} outside pp = {}", rank_, schedule_.pp);
  if (schedule_.pp > 1) {
    TRIPOD_CHECK(pp_ && pp_->size() == schedule_.pp && pp_->rank() == rank_,
                 "pipeline communicator (size {}, rank {}) does not fit the schedule (pp = {}, rank {})",
                 pp_ ? pp_->size() : 0, pp_ ? pp_->rank() : -1, schedule_.pp, rank_);
  }
  // Where each result goes when the next (or, backward, previous) stage is on this rank too.
  const auto& list = schedule_.ranks[rank_];
  const int S = schedule_.num_stages();
  std::vector<int> pos(kActionKinds * static_cast<size_t>(schedule_.vp) * schedule_.microbatches, -1);
  auto key = [&](const Action& a) {
    return (static_cast<size_t>(a.kind) * schedule_.vp + a.chunk) * schedule_.microbatches + a.mb;
  };
  for (int i = 0; i < static_cast<int>(list.size()); ++i) pos[key(list[i])] = i;
  local_next_.assign(list.size(), -1);
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    const Action& a = list[i];
    has_split_ |= !a.forward() && a.kind != ActionKind::Backward;
    if (a.kind == ActionKind::Weight) continue;  // W neither takes nor gives a pipeline tensor
    const int to = schedule_.stage(rank_, a.chunk) + (a.forward() ? 1 : -1);
    if (to < 0 || to >= S || schedule_.rank_of_stage(to) != rank_) continue;
    const int c = schedule_.chunk_of_stage(to);
    // A gradient goes to the previous stage's B, or its I when that backward is split.
    local_next_[i] = a.forward() ? pos[key(F(a.mb, c))] : std::max(pos[key(B(a.mb, c))], pos[key(I(a.mb, c))]);
  }
}

void PipelineExecutor::hold(int delta) {
  held_ += delta;
  peak_held_ = std::max(peak_held_, held_);
}

void PipelineExecutor::run(const PipelineCallbacks& cb) {
  TRIPOD_CHECK(cb.forward && (cb.backward || schedule_.forward_only), "pipeline callbacks need forward and backward");
  TRIPOD_CHECK(!has_split_ || (cb.backward_input && cb.backward_weight),
               "the {} schedule splits backwards into I and W: pipeline callbacks need backward_input and "
               "backward_weight", enum_name(schedule_.kind));
  const auto& list = schedule_.ranks[rank_];
  recvs_.clear();
  sends_.clear();
  recvs_.resize(plan_.messages.size());
  sends_.resize(plan_.messages.size());
  inputs_.assign(list.size(), Tensor{});
  held_ = peak_held_ = 0;
  for (const PlanOp& op : plan_.ranks[rank_]) {
    switch (op.kind) {
      case PlanOpKind::PostRecv: post_recv(op.index, cb); break;
      case PlanOpKind::WaitRecv: wait_recv(op.index); break;
      case PlanOpKind::Compute: compute(op.index, cb); break;
      case PlanOpKind::PostSend: post_send(op.index, cb); break;
      case PlanOpKind::WaitSend: wait_send(op.index); break;
    }
  }
  TRIPOD_CHECK(held_ == 0, "pipeline rank {} ended the step holding {} tensors", rank_, held_);
  recvs_.clear();
  sends_.clear();
  inputs_.clear();
}

void PipelineExecutor::post_recv(int id, const PipelineCallbacks& cb) {
  TRIPOD_CHECK(cb.recv_buffer, "pipeline callbacks need recv_buffer when stages are on other ranks");
  const PipeMessage& m = plan_.messages[id];
  InFlight& f = recvs_[id];
  f.tensor = cb.recv_buffer(m.dst.mb, m.dst.chunk, m.grad);
  TRIPOD_CHECK(f.tensor.defined(), "recv_buffer gave no tensor for the {} of {}", m.grad ? "gradient" : "input",
               m.dst.str());
  {
    FlightPhase phase(flight_, flight_ ? m.dst.str().c_str() : "");
    f.req = pp_->irecv(f.tensor, m.src_rank, m.tag);
  }
  hold(+1);
}

void PipelineExecutor::wait_recv(int id) {
  const PipeMessage& m = plan_.messages[id];
  InFlight& f = recvs_[id];
  {
    auto span = tracing() ? trace_->span("recv " + m.dst.str(), TraceCategory::Recv, m.dst.mb, m.dst.chunk)
                       : TraceRecorder::Span{};
    f.req->wait();
  }
  inputs_[m.dst_index] = std::move(f.tensor);
  f = InFlight{};
}

void PipelineExecutor::compute(int i, const PipelineCallbacks& cb) {
  const Action& a = schedule_.ranks[rank_][i];
  const int st = schedule_.stage(rank_, a.chunk);
  const int S = schedule_.num_stages();
  Tensor in = std::move(inputs_[i]);
  inputs_[i] = Tensor{};
  const bool w = a.kind == ActionKind::Weight;  // W neither takes nor gives a pipeline tensor
  const bool has_input = !w && (a.forward() ? st > 0 : st + 1 < S);
  const bool has_output = !w && (a.forward() ? st + 1 < S : st > 0);
  TRIPOD_CHECK(in.defined() == has_input, "{} on pipeline rank {}: input {}expected", a.str(), rank_,
               has_input ? "" : "not ");
  Tensor out;
  {
    FlightPhase phase(flight_, flight_ ? a.str().c_str() : "");
    auto span = tracing() ? trace_->span(a.str(), a.forward() ? TraceCategory::Forward : TraceCategory::Backward, a.mb,
                                      a.chunk)
                       : TraceRecorder::Span{};
    switch (a.kind) {
      case ActionKind::Forward: out = cb.forward(a.mb, a.chunk, in); break;
      case ActionKind::Backward: out = cb.backward(a.mb, a.chunk, in); break;
      case ActionKind::Input: out = cb.backward_input(a.mb, a.chunk, in); break;
      case ActionKind::Weight: cb.backward_weight(a.mb, a.chunk); break;
    }
  }
  if (has_input) hold(-1);
  in = Tensor{};
  if (has_output) {
    TRIPOD_CHECK(out.defined(), "{} (virtual stage {}) returned no tensor, but stage {} needs its {}", a.str(), st,
                 a.forward() ? st + 1 : st - 1, a.forward() ? "output" : "input gradient");
    hold(+1);
    if (local_next_[i] >= 0)
      inputs_[local_next_[i]] = std::move(out);
    else
      result_ = std::move(out);
  }
  // With a send to post, chunk_done waits until the gradient is on its way (post_send).
  if (plan_.send_msg[rank_][i] < 0 && !a.forward() && plan_.last_backward[rank_][a.chunk] == i && cb.chunk_done)
    cb.chunk_done(a.chunk);
}

void PipelineExecutor::post_send(int id, const PipelineCallbacks& cb) {
  const PipeMessage& m = plan_.messages[id];
  InFlight& f = sends_[id];
  f.tensor = std::move(result_);
  result_ = Tensor{};
  {
    auto span = tracing() ? trace_->span("send " + m.src.str(), TraceCategory::Send, m.src.mb, m.src.chunk)
                       : TraceRecorder::Span{};
    FlightPhase phase(flight_, flight_ ? m.src.str().c_str() : "");
    f.req = pp_->isend(f.tensor, m.dst_rank, m.tag);
  }
  if (!m.src.forward() && plan_.last_backward[rank_][m.src.chunk] == m.src_index && cb.chunk_done)
    cb.chunk_done(m.src.chunk);
}

void PipelineExecutor::wait_send(int id) {
  const PipeMessage& m = plan_.messages[id];
  InFlight& f = sends_[id];
  {
    auto span = tracing() ? trace_->span("send wait " + m.src.str(), TraceCategory::Send, m.src.mb, m.src.chunk)
                       : TraceRecorder::Span{};
    f.req->wait();
  }
  f = InFlight{};
  hold(-1);
}

}  // namespace tripod
