// Context-parallel attention: the blocks of each ring step, and the ring / all-gather exchanges.
#include "parallel/context_parallel/attention.h"

#include <algorithm>
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

bool cp_block_visible(const Documents& docs, int64_t c, int qc, int kc) {
  if (kc >= qc) return kc == qc;
  for (int64_t b = 0; b < docs.B; ++b)
    if (docs.start_of(b, qc * c) < (kc + 1) * c) return true;
  return false;
}

int64_t cp_kv_suffix(const Documents& docs, int64_t c, int kc, int64_t b) {
  const int64_t end = (kc + 1) * c;
  if (end >= docs.T) return 0;
  return end - std::max<int64_t>(kc * c, docs.start_of(b, end));
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

// ---- packed documents ----------------------------------------------------------------------------
// Every rank's key chunks travel as their suffix rows (cp_kv_suffix), packed slot-major then by
// sequence: the "wire" form of source rank `src` holds, for slot 0 then 1 and sequence 0..B-1, the
// last rows of that (slot, sequence). What a rank receives is unpacked into a whole (N, 2 Hkv D)
// buffer whose other rows are never read (no query sees them).
struct Wire {
  const CpAttentionShape& s;
  const Documents& docs;
  int cp;
  // Rows of (slot, sequence) of rank `src`'s wire form, in wire order, and their total.
  std::vector<int64_t> rows(int src) const {
    std::vector<int64_t> out;
    for (int slot = 0; slot < 2; ++slot)
      for (int64_t b = 0; b < s.B; ++b) out.push_back(cp_kv_suffix(docs, s.c, cp_chunk(cp, src, slot), b));
    return out;
  }
  int64_t total(int src) const {
    int64_t n = 0;
    for (int64_t r : rows(src)) n += r;
    return n;
  }
  // Copies between the whole layout (N, w) and the wire form of `src` (its first total(src) rows);
  // to_wire: whole -> wire; else wire -> whole; accumulate: the destination += the source.
  void move(Ops& ops, int src, const Tensor& from, Tensor& to, bool to_wire, bool accumulate = false) const {
    const std::vector<int64_t> n = rows(src);
    int64_t at = 0;
    for (int slot = 0; slot < 2; ++slot)
      for (int64_t b = 0; b < s.B; ++b) {
        const int64_t len = n[slot * s.B + b];
        if (len == 0) continue;
        const int64_t row = (slot * s.B + b) * s.c + s.c - len;
        const Tensor whole = (to_wire ? from : to).slice(row, row + len), wire = (to_wire ? to : from).slice(at, at + len);
        Tensor dst = to_wire ? wire : whole;
        const Tensor& src_rows = to_wire ? whole : wire;
        if (accumulate)
          ops.accumulate(dst, src_rows);
        else
          ops.copy(src_rows, dst);
        at += len;
      }
  }
};

// The blocks of ring step `step` that the documents leave anything visible in.
std::vector<CpBlock> visible_blocks(const Documents& docs, int64_t c, int cp, int r, int step) {
  std::vector<CpBlock> out;
  const int src = cp_step_source(cp, r, step);
  for (const CpBlock& b : cp_step_blocks(cp, r, step))
    if (cp_block_visible(docs, c, cp_chunk(cp, r, b.q_slot), cp_chunk(cp, src, b.kv_slot))) out.push_back(b);
  return out;
}

// The document mask of a block: the query slot's document starts and the key chunk's position.
BlockDocs block_docs(const Documents& docs, const CpAttentionShape& s, int cp, int r, int step, const CpBlock& b) {
  const int64_t n = s.B * s.c;
  return {.start = docs.doc_start.slice(b.q_slot * n, (b.q_slot + 1) * n).view({s.B, s.c}),
          .key_pos = cp_chunk(cp, cp_step_source(cp, r, step), b.kv_slot) * s.c};
}

void docs_forward(Ops& ops, Communicator& comm, CpComm mode, const CpAttentionShape& s, const Tensor& qkv, Tensor& out,
                  Tensor& lse, TraceRecorder* trace, const Documents& docs) {
  const int cp = comm.size(), r = comm.rank();
  const int64_t N = s.N(), heads = s.H + 2 * s.Hkv, kvw = 2 * s.Hkv * s.D;
  TRIPOD_CHECK(qkv.numel() == N * heads * s.D && out.numel() == N * s.H * s.D && out.dtype() == DType::F32 &&
                   lse.numel() == N * s.H && docs.doc_start.numel() == N && docs.T == 2 * cp * s.c && docs.B == s.B,
               "cp_attention_forward (documents): qkv {}, out {}, lse {}, document starts {} for B={} c={} of T={}",
               qkv.str(), out.str(), lse.str(), docs.doc_start.str(), s.B, s.c, docs.T);
  const Slots sl{s};
  const Wire wire{s, docs, cp};
  const Tensor q2 = qkv.view({N, heads * s.D});
  Tensor kv = ops.empty({N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
  ops.attention_kv_pack(q2, s.H, kv);
  ops.fill(lse, -INFINITY);
  auto compute = [&](int step, const Tensor& kv_src, const std::function<void()>& between = {}) {
    const std::vector<CpBlock> blocks = visible_blocks(docs, s.c, cp, r, step);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const CpBlock& b = blocks[i];
      Tensor o = sl.rows(out, b.q_slot, s.H), l = sl.lse(lse, b.q_slot);
      ops.attention_block_forward(sl.rows(q2, b.q_slot, heads), sl.rows(kv_src, b.kv_slot, 2 * s.Hkv), b.causal,
                                  block_docs(docs, s, cp, r, step, b), o, l);
      if (between && i + 1 < blocks.size()) between();
    }
  };
  if (cp == 1) return compute(0, kv);
  Tensor other = ops.empty({N, kvw}, ops.compute_dtype(), MemCategory::Workspace);  // a source's rows, unpacked
  if (mode == CpComm::AllGather) {
    compute(0, kv);
    int64_t widest = 0;
    for (int src = 0; src < cp; ++src) widest = std::max(widest, wire.total(src));
    if (widest == 0) return;  // no key of any chunk is seen from a later one
    Tensor mine = ops.empty({widest, kvw}, ops.compute_dtype(), MemCategory::Workspace);
    wire.move(ops, r, kv, mine, /*to_wire=*/true);
    Tensor all = ops.empty({cp * widest, kvw}, ops.compute_dtype(), MemCategory::Workspace);
    {
      auto span = cp_span(trace, kGather);
      comm.all_gather(mine, all);
    }
    for (int k = 1; k < cp; ++k) {
      const int src = cp_step_source(cp, r, k);
      wire.move(ops, src, all.slice(src * widest, (src + 1) * widest), other, /*to_wire=*/false);
      compute(k, other);
    }
    return;
  }
  // Ring: the wire form of step k + 1's source travels while step k computes.
  const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
  Tensor held = ops.empty({std::max<int64_t>(wire.total(r), 1), kvw}, ops.compute_dtype(), MemCategory::Workspace);
  wire.move(ops, r, kv, held, /*to_wire=*/true);
  for (int k = 0; k < cp; ++k) {
    std::unique_ptr<CommRequest> send, recv;
    Tensor arriving, in, outgoing;
    if (k + 1 < cp) {
      const int64_t out_rows = wire.total(cp_step_source(cp, r, k)), in_rows = wire.total(cp_step_source(cp, r, k + 1));
      auto span = cp_span(trace, kRingForward);
      arriving = ops.empty({std::max<int64_t>(in_rows, 1), kvw}, ops.compute_dtype(), MemCategory::Workspace);
      in = arriving.slice(0, std::max<int64_t>(in_rows, 1));
      outgoing = held.slice(0, std::max<int64_t>(out_rows, 1));
      if (in_rows > 0) recv = comm.irecv(in, prev, kKvTag);
      if (out_rows > 0) send = comm.isend(outgoing, next, kKvTag);
      progress({recv.get(), send.get()});
    }
    compute(k, k == 0 ? kv : other, [&] { progress({recv.get(), send.get()}); });
    if (k + 1 < cp) {
      auto span = cp_span(trace, kRingForward);
      if (send) send->wait();
      if (recv) recv->wait();
      held = arriving;
      wire.move(ops, cp_step_source(cp, r, k + 1), held, other, /*to_wire=*/false);
    }
  }
}

void docs_backward(Ops& ops, Communicator& comm, CpComm mode, const CpAttentionShape& s, const Tensor& dout,
                   const Tensor& qkv, const Tensor& out, const Tensor& lse, Tensor& dqkv, TraceRecorder* trace,
                   const Documents& docs) {
  const int cp = comm.size(), r = comm.rank();
  const int64_t N = s.N(), heads = s.H + 2 * s.Hkv, kvw = 2 * s.Hkv * s.D;
  TRIPOD_CHECK(qkv.numel() == N * heads * s.D && dqkv.numel() == qkv.numel() && out.numel() == N * s.H * s.D &&
                   dout.numel() == out.numel() && lse.numel() == N * s.H && docs.doc_start.numel() == N &&
                   docs.T == 2 * cp * s.c && docs.B == s.B,
               "cp_attention_backward (documents): dout {}, qkv {}, out {}, lse {}, dqkv {}", dout.str(), qkv.str(),
               out.str(), lse.str(), dqkv.str());
  const Slots sl{s};
  const Wire wire{s, docs, cp};
  const Tensor q2 = qkv.view({N, heads * s.D});
  Tensor dq2 = dqkv.view({N, heads * s.D});
  const bool direct = dqkv.dtype() == DType::F32;
  Tensor dq = direct ? dq2 : ops.empty({N, heads * s.D}, DType::F32, MemCategory::Workspace);
  ops.fill(dq, 0.f);
  Tensor kv = ops.empty({N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
  ops.attention_kv_pack(q2, s.H, kv);
  auto compute = [&](int step, const Tensor& kv_src, Tensor& dkv, const std::function<void()>& between = {}) {
    const std::vector<CpBlock> blocks = visible_blocks(docs, s.c, cp, r, step);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const CpBlock& b = blocks[i];
      Tensor dqs = sl.rows(dq, b.q_slot, heads), dkvs = sl.rows(dkv, b.kv_slot, 2 * s.Hkv);
      ops.attention_block_backward(sl.rows(dout, b.q_slot, s.H), sl.rows(q2, b.q_slot, heads),
                                   sl.rows(kv_src, b.kv_slot, 2 * s.Hkv), sl.rows(out, b.q_slot, s.H),
                                   sl.lse(lse, b.q_slot), b.causal, block_docs(docs, s, cp, r, step, b), dqs, dkvs);
      if (between && i + 1 < blocks.size()) between();
    }
  };
  // This rank's keys' gradient: its own blocks' share here, the other ranks' added at the end.
  Tensor mine = ops.empty({N, kvw}, DType::F32, MemCategory::Workspace);
  ops.fill(mine, 0.f);
  Tensor home;  // the other ranks' shares of this rank's suffix rows, in wire form
  if (cp == 1) {
    compute(0, kv, mine);
  } else if (mode == CpComm::AllGather) {
    compute(0, kv, mine);
    int64_t widest = 0;
    for (int src = 0; src < cp; ++src) widest = std::max(widest, wire.total(src));
    if (widest > 0) {
      Tensor wired = ops.empty({widest, kvw}, ops.compute_dtype(), MemCategory::Workspace);
      wire.move(ops, r, kv, wired, /*to_wire=*/true);
      Tensor all = ops.empty({cp * widest, kvw}, ops.compute_dtype(), MemCategory::Workspace);
      {
        auto span = cp_span(trace, kGather);
        comm.all_gather(wired, all);
      }
      Tensor other = ops.empty({N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
      Tensor part = ops.empty({N, kvw}, DType::F32, MemCategory::Workspace);
      Tensor dall = ops.empty({cp * widest, kvw}, DType::F32, MemCategory::Workspace);
      ops.fill(dall, 0.f);
      for (int k = 1; k < cp; ++k) {
        const int src = cp_step_source(cp, r, k);
        wire.move(ops, src, all.slice(src * widest, (src + 1) * widest), other, /*to_wire=*/false);
        ops.fill(part, 0.f);
        compute(k, other, part);
        Tensor d = dall.slice(src * widest, (src + 1) * widest);
        wire.move(ops, src, part, d, /*to_wire=*/true);
      }
      all = other = part = Tensor{};
      home = ops.empty({widest, kvw}, DType::F32, MemCategory::Workspace);
      auto span = cp_span(trace, kScatter);
      comm.reduce_scatter(dall, home);
    }
  } else {
    // Ring: the wire form of each source travels as in the forward; after a rank computes a
    // source's blocks it passes on the sum of the other ranks' shares so far, its own added, which
    // after the source's last visit arrives home.
    const int next = (r + 1) % cp, prev = (r + cp - 1) % cp;
    Tensor other = ops.empty({N, kvw}, ops.compute_dtype(), MemCategory::Workspace);
    Tensor part = ops.empty({N, kvw}, DType::F32, MemCategory::Workspace);
    Tensor held = ops.empty({std::max<int64_t>(wire.total(r), 1), kvw}, ops.compute_dtype(), MemCategory::Workspace);
    wire.move(ops, r, kv, held, /*to_wire=*/true);
    Tensor sum_in;  // the shares of this step's source from the ranks it visited since its owner
    for (int k = 0; k < cp; ++k) {
      const int src = cp_step_source(cp, r, k);
      std::unique_ptr<CommRequest> send_kv, recv_kv, send_sum, recv_sum;
      Tensor arriving, in, outgoing, sum, sum_out, sum_arriving, sum_view;
      if (k + 1 < cp) {
        const int64_t out_rows = wire.total(src), in_rows = wire.total(cp_step_source(cp, r, k + 1));
        auto span = cp_span(trace, kRingBackward);
        arriving = ops.empty({std::max<int64_t>(in_rows, 1), kvw}, ops.compute_dtype(), MemCategory::Workspace);
        in = arriving.slice(0, std::max<int64_t>(in_rows, 1));
        outgoing = held.slice(0, std::max<int64_t>(out_rows, 1));
        if (in_rows > 0) recv_kv = comm.irecv(in, prev, kKvTag);
        if (out_rows > 0) send_kv = comm.isend(outgoing, next, kKvTag);
        progress({recv_kv.get(), send_kv.get()});
      }
      Tensor& dkv = k == 0 ? mine : part;
      if (k > 0) ops.fill(part, 0.f);
      compute(k, k == 0 ? kv : other, dkv, [&] { progress({recv_kv.get(), send_kv.get()}); });
      auto span = cp_span(trace, kRingBackward);
      if (k > 0) {
        // This rank's share joins the sum of step k's source, which moves on; the sum of the next
        // step's source (this rank's own after the last step) comes from the previous rank,
        // posted beside that send.
        const int64_t rows = wire.total(src), in_rows = wire.total(cp_step_source(cp, r, k + 1));
        sum = ops.empty({std::max<int64_t>(rows, 1), kvw}, DType::F32, MemCategory::Workspace);
        if (k == 1) {
          wire.move(ops, src, part, sum, /*to_wire=*/true);
        } else if (rows > 0) {
          Tensor head = sum.slice(0, rows);
          ops.copy(sum_in.slice(0, rows), head);
          wire.move(ops, src, part, sum, /*to_wire=*/true, /*accumulate=*/true);
        }
        sum_arriving = ops.empty({std::max<int64_t>(in_rows, 1), kvw}, DType::F32, MemCategory::Workspace);
        sum_view = sum_arriving.slice(0, std::max<int64_t>(in_rows, 1));
        sum_out = sum.slice(0, std::max<int64_t>(rows, 1));
        if (in_rows > 0) recv_sum = comm.irecv(sum_view, prev, kGradTag);
        if (rows > 0) send_sum = comm.isend(sum_out, next, kGradTag);
      }
      if (send_kv) send_kv->wait();
      if (recv_kv) recv_kv->wait();
      if (send_sum) send_sum->wait();
      if (recv_sum) recv_sum->wait();
      if (k > 0) sum_in = sum_arriving;
      if (k + 1 < cp) {
        held = arriving;
        wire.move(ops, cp_step_source(cp, r, k + 1), held, other, /*to_wire=*/false);
      }
    }
    home = sum_in;  // after the last step: this rank's own source, summed over the other ranks
  }
  if (home.defined()) wire.move(ops, r, home, mine, /*to_wire=*/false, /*accumulate=*/true);
  if (!direct) ops.copy(dq, dq2);
  ops.attention_kv_unpack(mine, s.H, dq2);
}

}  // namespace

void cp_attention_forward(Ops& ops, Communicator& comm, CpComm mode, const CpAttentionShape& s, const Tensor& qkv,
                          Tensor& out, Tensor& lse, TraceRecorder* trace, const Documents* docs) {
  if (docs && docs->mask) return docs_forward(ops, comm, mode, s, qkv, out, lse, trace, *docs);
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
      ops.attention_block_forward(sl.rows(q2, b.q_slot, heads), sl.rows(kv_src, b.kv_slot, 2 * s.Hkv), b.causal, {}, o,
                                  l);
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
                           TraceRecorder* trace, const Documents* docs) {
  if (docs && docs->mask) return docs_backward(ops, comm, mode, s, dout, qkv, out, lse, dqkv, trace, *docs);
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
                                   sl.lse(lse, b.q_slot), b.causal, {}, dqs, dkvs);
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
