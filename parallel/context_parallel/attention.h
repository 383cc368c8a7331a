// Context parallelism: every sequence split over the cp ranks of a CP group, with causal
// attention's work equal on every rank, and the attention itself across the group.
//
// Sharding (load-balanced): a sequence of T tokens is cut into 2*cp chunks of c = T / (2 cp);
// CP rank r holds chunks r and 2cp-1-r, stored slot-major: slot 0 holds chunk r of each of the
// micro-batch's B sequences ((B, c) tokens), slot 1 chunk 2cp-1-r. Example, cp = 2, T = 8
// (c = 2): rank 0 holds positions {0,1} and {6,7}, rank 1 {2,3} and {4,5}. Token-wise layers do
// not care about the order; positions (learned or rotary) are those of the chunk in the sequence.
//
// Attention: the (query chunk, key chunk) blocks with key chunk <= query chunk, a diagonal block
// causal, the others full; every rank computes 2 diagonal and 2cp-1 full blocks of c x c (query,
// key) pairs. The blocks are taken in ring order: at step k = 0..cp-1 the keys and values of CP
// rank (r - k) mod cp, both of its slots. Each block's result is merged into the running output
// by its log-sum-exp (Ops::attention_block_forward). CpComm::Ring passes the key/value blocks
// (only the Hkv key/value heads, never the queries) around the ring point to point, the next
// one in flight while the current one is computed (its requests given progress() between the
// step's blocks, since MPI moves data only inside its calls); the backward passes them around again with
// their gradient accumulators, which end at their owner after cp hops. CpComm::AllGather gathers
// every rank's keys and values at once and reduce-scatters their gradients. Both compute the same
// blocks in the same order; the gradient sums over the group's ranks are added in ring order
// (Ring) or by the communicator's reduce-scatter (AllGather): the same bits for cp = 2.
//
// Packed documents (data.reset_attention_mask, parallel/documents.h): a query sees only the keys
// of its own document, so a full block whose key chunk ends before the document of its first
// query starts is empty and skipped (cp_block_visible), and of a key chunk only the rows at its end
// that a later chunk's queries see (cp_kv_suffix: per sequence, the part of the document that runs
// on into the next chunk) ever leave its rank: the ring passes, and the all-gather gathers, just
// those rows of each chunk (packed back to back; every rank knows every chunk's documents, so
// every message's size), and their gradient sums travel the same way. A rank's own keys' gradient
// stays home: the ring's traveling sums carry only the other ranks' shares, and the all-gather
// reduce-scatters those; the owner adds them to its own (the same bits either way at cp = 2).
// With many short documents most full blocks are empty, and what travels is about one document
// per chunk and sequence instead of the chunk.
//
// Trace: with a recorder, every exchange is a span of category "cp" (nested in the layer's
// forward or backward span): "cp ring send/recv K/V" (forward) and "cp ring send/recv K/V, dK/dV"
// (backward) around the posting of each step's transfers and around the wait for them (the part
// the block's compute did not hide); "cp all-gather K/V" and "cp reduce-scatter dK/dV".
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/op.h"
#include "parallel/comm/communicator.h"
#include "parallel/documents.h"
#include "parallel/grid.h"
#include "parallel/pipeline/trace.h"

namespace tripod {

// One block: this rank's queries of slot q_slot against the keys of slot kv_slot of the step's
// source rank.
struct CpBlock {
  int q_slot = 0, kv_slot = 0;
  bool causal = false;  // the diagonal block (same chunk)
  bool operator==(const CpBlock&) const = default;
};
// The source of ring step k: CP rank (cp_rank - k) mod cp.
inline int cp_step_source(int cp, int cp_rank, int step) { return ((cp_rank - step) % cp + cp) % cp; }
// The blocks rank `cp_rank` computes at ring step `step`, in order (q slot, then kv slot).
std::vector<CpBlock> cp_step_blocks(int cp, int cp_rank, int step);
// The (query, key) pairs of causal attention rank `cp_rank` computes for one sequence and head
// with chunks of c tokens: c^2 per full block, c (c + 1) / 2 per diagonal block.
int64_t cp_attention_pairs(int cp, int cp_rank, int64_t c);

// Packed documents, chunks of c tokens: whether a query of chunk qc sees a key of chunk kc (a
// diagonal block always does; kc > qc never), and how many rows at the end of chunk kc of sequence
// b a query of a later chunk sees.
bool cp_block_visible(const Documents& docs, int64_t c, int qc, int kc);
int64_t cp_kv_suffix(const Documents& docs, int64_t c, int kc, int64_t b);

// The attention of this rank's tokens. B sequences, c tokens per chunk (N = 2 B c local tokens,
// slot-major), H query heads and Hkv key/value heads of D (this rank's TP share).
struct CpAttentionShape {
  int64_t B = 0, c = 0, H = 0, Hkv = 0, D = 0;
  int64_t N() const { return 2 * B * c; }
};

// qkv (N, (H + 2 Hkv) D), q and k rotated -> out (N, H D) f32 (the normalised attention), lse
// (2, B, H, c) f32. Collective over `cp` (every rank of the CP group calls it in the same order).
// `trace` (may be null) records the exchanges. `docs` (may be null): the micro-batch's packed
// documents, whose mask (docs->mask) applies with docs->doc_start (N) i32 on the device.
void cp_attention_forward(Ops& ops, Communicator& cp, CpComm mode, const CpAttentionShape& s, const Tensor& qkv,
                          Tensor& out, Tensor& lse, TraceRecorder* trace = nullptr, const Documents* docs = nullptr);
// dout, out (N, H D) (compute dtype), lse as the forward left it -> dqkv (N, (H + 2 Hkv) D)
// (compute dtype, overwritten).
void cp_attention_backward(Ops& ops, Communicator& cp, CpComm mode, const CpAttentionShape& s, const Tensor& dout,
                           const Tensor& qkv, const Tensor& out, const Tensor& lse, Tensor& dqkv,
                           TraceRecorder* trace = nullptr, const Documents* docs = nullptr);

}  // namespace tripod
