// The (DP, PP, CP, TP) rank grid as a value: sizes, coordinates and axis groups, as pure functions.
//
// Order: tp fastest, then cp (context parallelism: the sequence split over ranks), then dp, then
// pp, so a TP group is a run of consecutive ranks (one node), a CP group the next-closest, and
// pipeline stages are the slowest axis (they span nodes). Worked example, 8 ranks, tp=2 dp=2 pp=2
// (cp=1):
//   rank:   0 1 2 3 4 5 6 7
//   tp:     0 1 0 1 0 1 0 1
//   dp:     0 0 1 1 0 0 1 1
//   pp:     0 0 0 0 1 1 1 1
//   TP groups {0,1} {2,3} {4,5} {6,7}; DP groups {0,2} {1,3} {4,6} {5,7};
//   PP groups {0,4} {1,5} {2,6} {3,7}.
// With tp=2 cp=2 dp=2 (8 ranks): rank = tp + 2 (cp + 2 dp); CP groups {0,2} {1,3} {4,6} {5,7};
// DP groups {0,4} {1,5} {2,6} {3,7}; the gradients are reduced over DP x CP: {0,2,4,6} {1,3,5,7}.
//
// Expert parallelism (ep) adds no ranks: it folds the DP x CP group of each (tp, pp), as Megatron
// does, into ep consecutive members (by DP x CP index, cp fastest) that split the routed experts
// between them (EP), times dp*cp/ep replicas of that split (EDP, expert data parallelism: the
// ranks holding the same experts, over which expert gradients are reduced). Same 8 ranks with
// ep=2: DP x CP indices 0..3 of {0,2,4,6} are ranks 0,2,4,6; EP groups {0,2} {4,6} (and {1,3}
// {5,7}); EDP groups {0,4} {2,6} {1,5} {3,7}.
#pragma once

#include <string>
#include <vector>

#include "core/enum_names.h"

namespace tripod {

// How context-parallel attention reaches the other chunks' keys and values (parallel.cp_comm):
// passed around the CP ring point to point, one block per step (Ring), or all-gathered at once
// (AllGather). Both compute the same blocks in the same order (parallel/context_parallel).
enum class CpComm { Ring, AllGather };
template <> struct EnumNames<CpComm> { static constexpr std::array<std::string_view, 2> names{"ring", "allgather"}; };


// DPCP: the ranks sharing (tp, pp), over which gradients are reduced (DP x CP), in rank order.
// EP: the ranks of a DP x CP group that split the experts between them; EDP: those holding the
// same experts (expert gradients are reduced over it; EP x EDP = DP x CP).
enum class Axis { TP, DP, PP, CP, DPCP, EP, EDP };

// How expert parallelism moves tokens to their experts (parallel.moe_dispatcher): each row to the
// rank of its expert and back, one variable-size all-to-all each way (AllToAll), or every EP rank's
// tokens gathered everywhere and the outputs reduce-scattered back (AllGather).
enum class MoeDispatcher { AllToAll, AllGather };
template <> struct EnumNames<MoeDispatcher> {
  static constexpr std::array<std::string_view, 2> names{"alltoall", "allgather"};
};

struct Coords {
  int tp = 0, dp = 0, pp = 0, cp = 0;
  bool operator==(const Coords&) const = default;
};

// Context parallelism cuts every sequence into 2cp chunks and CP rank r holds two of them (load
// balance under the causal mask): slot 0 is chunk r, slot 1 chunk 2cp-1-r. Example, cp = 2: rank 0
// holds chunks 0 and 3, rank 1 chunks 1 and 2. The one definition of where a rank's tokens sit.
inline int cp_chunk(int cp, int cp_rank, int slot) { return slot == 0 ? cp_rank : 2 * cp - 1 - cp_rank; }

class RankGrid {
 public:
  RankGrid() = default;
  RankGrid(int tp, int dp, int pp, int cp = 1, int ep = 1);

  int tp() const { return tp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int cp() const { return cp_; }
  int ep() const { return ep_; }
  int world_size() const { return tp_ * cp_ * dp_ * pp_; }
  int size(Axis a) const;
  // This rank's index in its DP x CP group (cp fastest): the "data-parallel" rank of the
  // gradient reduction and the distributed optimizer.
  int dpcp_rank(const Coords& c) const { return c.cp + cp_ * c.dp; }
  // Expert parallelism: the rank's index in its EP group (which experts it holds: E/ep of them,
  // from ep_rank * E/ep) and in its EDP group (its replica of those experts).
  int ep_rank(const Coords& c) const { return dpcp_rank(c) % ep_; }
  int edp_rank(const Coords& c) const { return dpcp_rank(c) / ep_; }

  Coords coords(int rank) const;
  int rank(Coords c) const { return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp)); }
  // The ranks of `rank`'s group along `axis`, in order of their coordinate on that axis.
  std::vector<int> group(Axis axis, int rank) const;
  // All groups along an axis, each in coordinate order (what MPI_Comm_split is driven by).
  std::vector<std::vector<int>> groups(Axis axis) const;
  // The ranks holding the tied embedding (first and last pipeline stage) for rank's (tp, dp).
  std::vector<int> embedding_group(int rank) const;

  std::string str() const;  // "(dp=2, pp=2, tp=2)", with ", cp=2" and ", ep=2" when above 1
  bool operator==(const RankGrid&) const = default;

 private:
  int tp_ = 1, dp_ = 1, pp_ = 1, cp_ = 1, ep_ = 1;
};

}  // namespace tripod
