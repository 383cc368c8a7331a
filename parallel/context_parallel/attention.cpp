// Context-parallel attention: the blocks of each ring step, and the ring / all-gather exchanges.
#include "parallel/context_parallel/attention.h"

#include <cmath>
#include <functional>
#include <initializer_list>
#include <utility>

#include "core/error.h"

namespace tripod {

std::vector<CpBlock> cp_step_blocks(int cp, int cp_rank, int step) {
  const int src = cp_step_source(cp, cp_rank, step);
  std::vector<CpBlock> out;
  for (int qs = 0; qs < 2; ++qs)
    for (int ks = 0; ks < 2; ++ks) {
      const int qc = cp_chunk(cp, cp_rank, qs), kc = cp_chunk(cp, src, ks);
      if (kc <= qc) out.push_back({qs, ks, kc == qc});
    }
  return out;
}

int64_t cp_attention_pairs(int cp, int cp_rank, int64_t c) {
  int64_t pairs = 0;
  for (int k = 0; k < cp; ++k)
    for (const CpBlock& b : cp_step_blocks(cp, cp_rank, k)) pairs += b.causal ? c * (c + 1) / 2 : c * c;
  return pairs;
}

namespace {

// Views of one slot (the B sequences' tokens of one chunk) of the rank's slot-major tensors.
struct Slots {
  const CpAttentionShape& s;
  Tensor rows(const Tensor& t, int slot, int64_t heads) const {
    return t.slice(slot * s.B * s.c, (slot + 1) * s.B * s.c).view({s.B, s.c, heads, s.D});
  }
  Tensor lse(const Tensor& t, int slot) const {
    const int64_t n = s.B * s.H * s.c;
    return t.flat(slot * n, (slot + 1) * n).view({s.B, s.H, s.c});
  }
};

constexpr int kKvTag = 0, kGradTag = 1;

// A span of the CP exchanges on `trace`, or nothing when it is null.
TraceRecorder::Span cp_span(TraceRecorder* trace, std::string_view name) {
  return trace ? trace->span(name, TraceCategory::ContextParallel) : TraceRecorder::Span{};
}
// Advances the ring's transfers in flight: called once they are posted and between the blocks of
// a step, so that the next block's keys and values arrive while this one computes (MPI moves data
// only inside its calls; NCCL launches the queued sends and receives then, as one group, after
// the compute stream's work so far).
void progress(std::initializer_list<CommRequest*> requests) {
  for (CommRequest* r : requests)
    if (r) r->progress();
}
constexpr std::string_view kRingForward = "cp ring send/recv K/V", kRingBackward = "cp ring send/recv K/V, dK/dV",
                           kGather = "cp all-gather K/V", kScatter = "cp reduce-scatter dK/dV";

}  // namespace

void cp_attention_forward(Ops& ops, Communicator& comm, CpComm mode, const CpAttentionShape& s, const Tensor& qkv,
                          Tensor& out, Tensor& lse, TraceRecorder* trace) {
  const int cp = comm.size(), r = comm.rank();
  const int64_t N = s.N(), heads = s.H + 2 * s.Hkv, kvw = 2 * s.Hkv * s.D;
  TRIPOD_CHECK(qkv.numel() == N * heads * s.D && out.numel() == N * s.H * s.D && out.dtype() == DType::F32 &&
                   lse.numel() == N * s.H && lse.dtype() == DType::F32,
               "cp_attention_forward: qkv {}, out {}, lse {} for B={} c={} H={} Hkv={} D={}", qkv.str(), out.str(),
               lse.str(), s.B, s.c, s.H, s.Hkv, s.D);
  const Slots sl{s};
  const Tensor q2 = qkv.view({N, heads * s.D});
  Tensor kv = ops.empty({N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
  ops.attention_kv_pack(q2, s.H, kv);
  ops.fill(lse, -INFINITY);
  // The step's blocks; `between` runs after each block but the last.
  auto compute = [&](int step, const Tensor& kv_src, const std::function<void()>& between = {}) {
    const std::vector<CpBlock> blocks = cp_step_blocks(cp, r, step);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const CpBlock& b = blocks[i];
      Tensor o = sl.rows(out, b.q_slot, s.H), l = sl.lse(lse, b.q_slot);
      ops.attention_block_forward(sl.rows(q2, b.q_slot, heads), sl.rows(kv_src, b.kv_slot, 2 * s.Hkv), b.causal, o, l);
      if (between && i + 1 < blocks.size()) between();
    }
  };
  if (mode == CpComm::AllGather) {
    Tensor all = ops.empty({cp * N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
    {
      auto span = cp_span(trace, kGather);
      comm.all_gather(kv, all);
    }
    kv = Tensor{};
    for (int k = 0; k < cp; ++k) {
      const int src = cp_step_source(cp, r, k);
      compute(k, all.slice(src * N, (src + 1) * N));
    }
    return;
  }
  // Ring: the block of step k + 1 travels while step k computes.
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  Tensor other = ops.empty({N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
  for (int k = 0; k < cp; ++k) {
    std::unique_ptr<CommRequest> send, recv;
    if (k + 1 < cp) {
      auto span = cp_span(trace, kRingForward);
      recv = comm.irecv(other, prev, kKvTag);
      send = comm.isend(kv, next, kKvTag);
      progress({recv.get(), send.get()});
    }
    compute(k, kv, [&] { progress({recv.get(), send.get()}); });
    if (send) {
      auto span = cp_span(trace, kRingForward);
      send->wait();
      recv->wait();
      std::swap(kv, other);
    }
  }
}

void cp_attention_backward(Ops& ops, Communicator& comm, CpComm mode, const CpAttentionShape& s, const Tensor& dout,
                           const Tensor& qkv, const Tensor& out, const Tensor& lse, Tensor& dqkv,
                           TraceRecorder* trace) {
  const int cp = comm.size(), r = comm.rank();
  const int64_t N = s.N(), heads = s.H + 2 * s.Hkv, kvw = 2 * s.Hkv * s.D;
  TRIPOD_CHECK(qkv.numel() == N * heads * s.D && dqkv.numel() == qkv.numel() && out.numel() == N * s.H * s.D &&
                   dout.numel() == out.numel() && lse.numel() == N * s.H,
               "cp_attention_backward: dout {}, qkv {}, out {}, lse {}, dqkv {}", dout.str(), qkv.str(), out.str(),
               lse.str(), dqkv.str());
  const Slots sl{s};
  const Tensor q2 = qkv.view({N, heads * s.D});
  Tensor dq2 = dqkv.view({N, heads * s.D});
  // The query gradients accumulate in f32: dqkv itself when that is the compute dtype.
  const bool direct = dqkv.dtype() == DType::F32;
  Tensor dq = direct ? dq2 : ops.empty({N, heads * s.D}, DType::F32, MemCategory::Workspace);
  ops.fill(dq, 0.f);
  Tensor kv = ops.empty({N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
  ops.attention_kv_pack(q2, s.H, kv);
  // The step's blocks: dq of this rank's queries, dkv (zeroed) of the source's keys and values.
  auto compute = [&](int step, const Tensor& kv_src, Tensor& dkv, const std::function<void()>& between = {}) {
    const std::vector<CpBlock> blocks = cp_step_blocks(cp, r, step);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const CpBlock& b = blocks[i];
      Tensor dqs = sl.rows(dq, b.q_slot, heads), dkvs = sl.rows(dkv, b.kv_slot, 2 * s.Hkv);
      ops.attention_block_backward(sl.rows(dout, b.q_slot, s.H), sl.rows(q2, b.q_slot, heads),
                                   sl.rows(kv_src, b.kv_slot, 2 * s.Hkv), sl.rows(out, b.q_slot, s.H),
                                   sl.lse(lse, b.q_slot), b.causal, dqs, dkvs);
      if (between && i + 1 < blocks.size()) between();
    }
  };
  Tensor mine = ops.empty({N, kvw}, DType::F32, MemCategory::Workspace);  // this rank's dK, dV
  if (mode == CpComm::AllGather) {
    Tensor all = ops.empty({cp * N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
    {
      auto span = cp_span(trace, kGather);
      comm.all_gather(kv, all);
    }
    kv = Tensor{};
    Tensor dall = ops.empty({cp * N, kvw}, DType::F32, MemCategory::Workspace);
    ops.fill(dall, 0.f);
    for (int k = 0; k < cp; ++k) {
      const int src = cp_step_source(cp, r, k);
      Tensor d = dall.slice(src * N, (src + 1) * N);
      compute(k, all.slice(src * N, (src + 1) * N), d);
    }
    all = Tensor{};
    auto span = cp_span(trace, kScatter);
    comm.reduce_scatter(dall, mine);
  } else {
    // Ring: each key/value block travels with the sum of the gradients the ranks it visited gave
    // it; after cp hops the sum is back at its owner. The block of step k + 1 arrives while step k
    // computes; the sums travel after it (each rank sends its own once computed, so the receive
    // of the previous rank's is posted beside that send: NCCL launches a send and a receive
    // posted together as one group, and a group holding a receive whose send comes later would
    // wait on every rank at once).
    const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
    Tensor other = ops.empty({N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
    Tensor acc = ops.empty({N, kvw}, DType::F32, MemCategory::Workspace);
    Tensor part = ops.empty({N, kvw}, DType::F32, MemCategory::Workspace);
    ops.fill(acc, 0.f);
    for (int k = 0; k < cp; ++k) {
      std::unique_ptr<CommRequest> send_kv, recv_kv, recv_acc, send_acc;
      if (k + 1 < cp) {
        auto span = cp_span(trace, kRingBackward);
        recv_kv = comm.irecv(other, prev, kKvTag);
        send_kv = comm.isend(kv, next, kKvTag);
        progress({recv_kv.get(), send_kv.get()});
      }
      ops.fill(part, 0.f);
      compute(k, kv, part, [&] { progress({recv_kv.get(), send_kv.get()}); });
      ops.accumulate(acc, part);
      auto span = cp_span(trace, kRingBackward);
      recv_acc = comm.irecv(mine, prev, kGradTag);
      send_acc = comm.isend(acc, next, kGradTag);
      if (send_kv) {
        send_kv->wait();
        recv_kv->wait();
        std::swap(kv, other);
      }
      send_acc->wait();
      recv_acc->wait();
      std::swap(acc, mine);
    }
    // The last swap left the owner's finished sum in acc.
    std::swap(acc, mine);
  }
  if (!direct) ops.copy(dq, dq2);
  ops.attention_kv_unpack(mine, s.H, dq2);
}

}  // namespace tripod
