// GradSync: how a rank's gradients are synchronised after its backward, a part of the rank layout
// (config/layout.h: make_rank_layout computes it once). The reducer is built from it, and the
// memory plan and the planner's cost model read it; nothing else decides these facts.
//
// Worked example, 8 ranks (tp=2, dp=2, pp=2), distributed optimizer, GPT-2 (tied table), loop
// placement: rank 5 (tp 1, dp 0, pp 1) reduces over its DP x CP group {5, 7} (group rank 0),
// reduce-scatters its buckets (chunks never share one; the tied table wte has its own) and updates
// the first half of each; its copy of wte first sums with pipeline rank 0's copy (rank 1) over the
// embedding group. Under the V placement both ends are on pipeline rank 0: one wte, no such sum.
//
// Expert parallelism (ep > 1) adds a second group: a rank's routed experts (ParamSpec::expert) are
// held by the ranks of its EDP group only (grid.h), so their gradients reduce there, in buckets of
// their own, sharded there under the distributed optimizer; everything else over DP x CP as before.
// Same 8 ranks with ep = 2, dp = 4, tp = 2 (pp = 1): rank 2 (tp 0, dp 1) reduces its attention,
// norms, routers and shared experts over {0, 2, 4, 6} and its experts (E/2 of them, those of EP
// rank 1) over {2, 6}.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/grid.h"

namespace tripod {

struct FlatSpan {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const FlatSpan&) const = default;
};

// Rank `rank`'s slice of `s` when a group of `n` shards it (the distributed optimizer): `s` cut
// into n blocks of ceil(size / n) elements, the last ones short or empty. Example: 10 elements
// over n = 4 -> [0, 3) [3, 6) [6, 9) [9, 10).
FlatSpan dp_shard(const FlatSpan& s, int n, int rank);

struct GradBucket {
  FlatSpan span;             // range of the flat buffers
  int64_t param_elements;    // elements of the parameters inside (the span less alignment gaps)
  bool operator==(const GradBucket&) const = default;
};

// Buckets of about `bucket_elements` from parameter ranges listed in registration order; filled
// back to front (the backward finishes the last parameters first). No bucket holds both
// parameter j and j+1 for j in `boundaries_after`.
std::vector<GradBucket> make_buckets(const std::vector<FlatSpan>& params, int64_t bucket_elements,
                                     const std::vector<int>& boundaries_after = {});

// Gradients summed over one group of ranks that hold the same parameters.
struct ReduceGroup {
  Axis axis = Axis::DPCP;           // DP x CP: the ranks sharing (tp, pp), cp fastest; or EDP (experts)
  int size = 1, rank = 0;           // the group's size and this rank's index in it
  bool sharded = false;             // distributed optimizer (size > 1): reduce-scatter, owned slices, all-gather
  std::vector<GradBucket> buckets;  // in flat order; filled back to front by the backward
  int64_t bucket_bytes = 0;         // the f32 bytes a bucket is filled to (parallel.bucket_mb)
  std::vector<FlatSpan> owned;      // per bucket, the range this rank's optimizer updates
  int64_t owned_elements() const;
};

struct GradSync {
  // Disjoint ranges of the flat buffers: groups[0] over DP x CP, and with expert parallelism
  // groups[expert_group] over EDP with the routed experts' parameters.
  std::vector<ReduceGroup> groups;
  int expert_group = -1;  // -1: none (ep = 1: experts reduce over DP x CP with the rest)
  // The group a parameter's gradient is reduced by (an index into groups): the one rule.
  int group_of(bool expert) const { return expert && expert_group >= 0 ? expert_group : 0; }
  // The tied input/output embedding table (GPT-2) where two chunks use it: its flat range, and
  // where its two uses' gradients meet before the group reduction, which waits for the step's
  // last backward. Local: one parameter written by two chunks of this rank (the V placement).
  // PipelineEnds: the first and the last pipeline rank each hold a copy (the loop placement,
  // pp > 1) and all-reduce them over the embedding group first. None: no table here, or one
  // chunk holds both ends (pp = 1) and it is reduced as any parameter.
  enum class Tied : uint8_t { None, Local, PipelineEnds };
  Tied tied = Tied::None;
  FlatSpan tied_table;
  int64_t owned_elements() const;
};

}  // namespace tripod
