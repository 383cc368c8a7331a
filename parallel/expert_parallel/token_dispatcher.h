// How the tokens of a mixture-of-experts layer reach the rows their experts compute, and come back
// (Megatron's token dispatcher): the router's choices in, a DispatchPlan out (data, kept with the
// router's decision, so a recomputed forward and a split backward's W move rows exactly as the
// forward did), and three movements by it. Without expert parallelism every expert is on every
// rank (LocalDispatcher); with it (parallel.ep > 1) the E experts are split over the ep ranks of
// an EP group (parallel/grid.h), rank q holding experts [q E/ep, (q + 1) E/ep), and rows travel:
//
//   alltoall   the pairs are put in expert order on the token's rank (which groups them by EP
//              rank), the kept counts are exchanged (one all-gather of E counts), and one
//              variable-size all-to-all each way carries exactly the rows: out to the experts'
//              ranks, where they arrive source after source and are reordered expert after
//              expert; back the same way reversed, then summed per token, weighted on return.
//   allgather  every EP rank's tokens (and choices and weights) are all-gathered, each rank takes
//              the rows of its own experts from them, and the outputs, summed per token into the
//              whole EP group's tokens, are reduce-scattered back (Megatron's AllGather
//              dispatcher: no count exchange, ep x the tokens moved).
//
// Worked example, ep = 2, E = 4, k = 1, no capacity: rank 0's tokens choose experts [2 0 3],
// rank 1's [1 2 2]. Rank 0 holds experts 0-1, rank 1 experts 2-3. Alltoall: rank 0 sends its
// token 1 (expert 0) to itself and tokens 0, 2 (experts 2, 3) to rank 1; rank 1 sends token 0
// (expert 1) to rank 0 and tokens 1, 2 to itself. Rank 1 receives [r0.t0 r0.t2 | r1.t1 r1.t2]
// (source after source) and computes them expert after expert: expert 2 = [r0.t0 r1.t1 r1.t2],
// expert 3 = [r0.t2]: offsets {0, 3, 4}.
//
// The capacity (moe.capacity_factor) is applied where the tokens are, per rank and micro-batch,
// as without expert parallelism: a run's drops do not depend on ep. Every method is collective
// over the EP group (each of its ranks calls it, in the same order): ranks whose experts get no
// rows still take part.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/op.h"
#include "parallel/context.h"

namespace tripod {

// The rows of one micro-batch's N tokens, k choices each (TokenDispatcher::plan's output).
struct DispatchPlan {
  int64_t tokens = 0, k = 0;  // N, k
  // Token side: this rank's pairs p = t k + j in expert order over all E experts, the first
  // `capacity` of each expert kept; these are the rows that leave this rank's tokens.
  Tensor row_of;                // (N k) i32: each pair's row in that order, -1 when dropped
  Tensor slot_of;               // (>= sent) i32: the pair of each of those rows
  std::vector<int64_t> routed;  // (E) host: this rank's pairs choosing each expert, before the capacity
  int64_t sent = 0;             // the kept pairs
  // Expert side: the rows this rank's experts compute, expert after expert, in the order of their
  // sources (EP rank, then pair): what the grouped GEMMs run over.
  std::vector<int64_t> offsets;  // (E/ep + 1) host: local expert e's rows are [offsets[e], offsets[e + 1])
  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  // alltoall: send_counts[q] rows to EP rank q (the token side's rows in order), recv_counts[q]
  // from it; src_of (R) i32 the arrival position of each expert row, dst_of (R) its inverse.
  std::vector<int64_t> send_counts, recv_counts;
  Tensor src_of, dst_of;
  // allgather: the EP group's pairs side by side (rank q's pair p is q N k + p, its token q N + t);
  // pair_of (R) i32 each expert row's pair, row_of_all (ep N k) i32 each pair's expert row here
  // (-1: elsewhere or dropped), weights_all (ep N k) f32 every pair's weight.
  Tensor pair_of, row_of_all, weights_all;

  // A split backward's W only dispatches: drops what only combine reads (row_of, dst_of, row_of_all).
  void keep_for_weight_gradients();
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // Host wall time spent in this dispatcher's methods since construction (the counts' exchange,
  // permutes, the all-to-alls or all-gathers and their waits): what bench_moe_cpu reports as the
  // dispatcher's share of the step. Meaningful on the CPU backend, where every call completes
  // before it returns; on CUDA it counts launches and host synchronisations only.
  double seconds() const { return seconds_; }
  // From the choices idx (N, k) i32 and their weights (N, k) f32: the plan `p`, keeping at most
  // `capacity` pairs of this rank's tokens per expert (< 0: all); its tensors charged to `category`.
  // One device-to-host copy (the grouped GEMMs' sizes are host values).
  virtual void plan(const Tensor& idx, const Tensor& weights, int64_t capacity, DispatchPlan& p,
                    MemCategory category) = 0;
  // xp (>= rows(), C): rows() rows of x (N, C) in expert order, each times its pair's weight when
  // `weights` ((N, k) f32, the plan's) is defined.
  virtual void dispatch(const Tensor& x, const DispatchPlan& p, const Tensor& weights, Tensor& xp) = 0;
  // y (N, C) = per token the sum over its kept pairs of yp's rows (>= rows()), weighted when
  // `weights` is defined (summed in order of the choices, except across EP ranks under allgather).
  virtual void combine(const Tensor& yp, const DispatchPlan& p, const Tensor& weights, Tensor& y) = 0;
  // The gradient through combine's weights, from g (>= rows(), F), the gradient with respect to
  // the experts' outputs before the second GEMM, and act, its input: dweights (N, k) f32 = per kept
  // pair <act row, g row> (0 when dropped), and each g row *= its pair's weight.
  virtual void combine_backward(Tensor& g, const Tensor& act, const DispatchPlan& p, const Tensor& weights,
                                Tensor& dweights) = 0;

 protected:
  double seconds_ = 0;
};

// Every expert on this rank: plans, permutes and un-permutes locally (phase one's bits).
class LocalDispatcher final : public TokenDispatcher {
 public:
  LocalDispatcher(Ops& ops, int64_t experts) : ops_(ops), experts_(experts) {}
  void plan(const Tensor& idx, const Tensor& weights, int64_t capacity, DispatchPlan& p, MemCategory category) override;
  void dispatch(const Tensor& x, const DispatchPlan& p, const Tensor& weights, Tensor& xp) override;
  void combine(const Tensor& yp, const DispatchPlan& p, const Tensor& weights, Tensor& y) override;
  void combine_backward(Tensor& g, const Tensor& act, const DispatchPlan& p, const Tensor& weights,
                        Tensor& dweights) override;

 private:
  Ops& ops_;
  int64_t experts_;
};

// parallel.moe_dispatcher = "alltoall" over `ep` (the EP group's communicator).
class AllToAllDispatcher final : public TokenDispatcher {
 public:
  AllToAllDispatcher(Ops& ops, Communicator& ep, int64_t experts) : ops_(ops), ep_(ep), experts_(experts) {}
  void plan(const Tensor& idx, const Tensor& weights, int64_t capacity, DispatchPlan& p, MemCategory category) override;
  void dispatch(const Tensor& x, const DispatchPlan& p, const Tensor& weights, Tensor& xp) override;
  void combine(const Tensor& yp, const DispatchPlan& p, const Tensor& weights, Tensor& y) override;
  void combine_backward(Tensor& g, const Tensor& act, const DispatchPlan& p, const Tensor& weights,
                        Tensor& dweights) override;

 private:
  Ops& ops_;
  Communicator& ep_;
  int64_t experts_;
};

// parallel.moe_dispatcher = "allgather" over `ep`.
class AllGatherDispatcher final : public TokenDispatcher {
 public:
  AllGatherDispatcher(Ops& ops, Communicator& ep, int64_t experts) : ops_(ops), ep_(ep), experts_(experts) {}
  void plan(const Tensor& idx, const Tensor& weights, int64_t capacity, DispatchPlan& p, MemCategory category) override;
  void dispatch(const Tensor& x, const DispatchPlan& p, const Tensor& weights, Tensor& xp) override;
  void combine(const Tensor& yp, const DispatchPlan& p, const Tensor& weights, Tensor& y) override;
  void combine_backward(Tensor& g, const Tensor& act, const DispatchPlan& p, const Tensor& weights,
                        Tensor& dweights) override;

 private:
  Ops& ops_;
  Communicator& ep_;
  int64_t experts_;
};

// The dispatcher of `par` for `experts` routed experts: local when the grid has ep = 1, else
// par.moe_dispatcher's over par.ep. The context only has to outlive the dispatcher.
std::unique_ptr<TokenDispatcher> make_token_dispatcher(Ops& ops, const ParallelContext& par, int64_t experts);

}  // namespace tripod
