// RankLayout: what the config and the rank imply, computed once (config/layout.h). The worked
// example of its header, the DP shards of every bucket covering it exactly once, and agreement
// with a model actually built from it.
#include <gtest/gtest.h>

#include "config/layout.h"
#include "harness.h"
#include "model/param_registry.h"

namespace tripod {
namespace {

Config grid_config(int tp, int dp, int pp, int vp) {
  Config c = test::tiny_config(/*n_layers=*/8);
  c.parallel.tp = tp;
  c.parallel.dp = dp;
  c.parallel.pp = pp;
  c.parallel.vp = vp;
  if (vp > 1) c.parallel.schedule = ScheduleKind::Interleaved;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 16;
  validate_layout(c, tp * dp * pp);
  return c;
}

TEST(RankLayout, TheWorkedExampleOfTheHeader) {
  Config c = grid_config(2, 2, 2, 2);
  c.parallel.sequence_parallel = true;
  const RankLayout l = make_rank_layout(c, 5);
  EXPECT_EQ(l.coords, (Coords{.tp = 1, .dp = 0, .pp = 1}));
  EXPECT_EQ(l.microbatches, 4);
  EXPECT_EQ(l.micro_tokens, 2 * 16);
  EXPECT_EQ(l.local_tokens, 16);  // sequence parallel over tp = 2
  EXPECT_EQ(l.schedule.kind, ScheduleKind::Interleaved);
  EXPECT_EQ(l.schedule.microbatches, 4);
  EXPECT_EQ(l.stage_layers, (std::vector<int>{2, 2, 2, 2}));
  ASSERT_EQ(l.chunks.size(), 2u);
  EXPECT_EQ(l.chunks[0].virtual_stage, 1);
  EXPECT_EQ(l.chunks[0].layer_begin, 2);
  EXPECT_EQ(l.chunks[1].virtual_stage, 3);
  EXPECT_EQ(l.chunks[1].layer_end, 8);
  EXPECT_FALSE(l.has_embedding);
  EXPECT_TRUE(l.has_head);
  EXPECT_EQ(l.plan.ranks.size(), 2u);
}

TEST(RankLayout, TheEndsAreHeldByTheFirstAndLastStage) {
  Config c = grid_config(1, 1, 4, 1);
  for (int r = 0; r < 4; ++r) {
    const RankLayout l = make_rank_layout(c, r);
    EXPECT_EQ(l.has_embedding, r == 0) << "rank " << r;
    EXPECT_EQ(l.has_head, r == 3) << "rank " << r;
    EXPECT_EQ(l.chunks[0].layer_end - l.chunks[0].layer_begin, 2);
  }
}

// Under the V placement rank 0 holds stage 0 and the last stage (both ends, one tied table) and
// the last rank the two middle stages; the layers follow the stages.
TEST(RankLayout, VPlacementPutsBothEndsOnRankZero) {
  Config c = test::tiny_config(/*n_layers=*/8);
  c.parallel.pp = 2;
  c.parallel.vp = 2;
  c.parallel.placement = Placement::V;
  c.parallel.schedule = ScheduleKind::Zbv;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 16;
  validate_layout(c, 2);
  const RankLayout l0 = make_rank_layout(c, 0), l1 = make_rank_layout(c, 1);
  EXPECT_EQ(l0.schedule.placement, Placement::V);
  ASSERT_EQ(l0.chunks.size(), 2u);
  EXPECT_EQ(l0.chunks[0].virtual_stage, 0);
  EXPECT_EQ(l0.chunks[1].virtual_stage, 3);
  EXPECT_EQ(l0.chunks[1].layer_begin, 6);
  EXPECT_TRUE(l0.has_embedding && l0.has_head);
  EXPECT_EQ(l1.chunks[0].virtual_stage, 1);
  EXPECT_EQ(l1.chunks[1].virtual_stage, 2);
  EXPECT_EQ(l1.chunks[1].layer_begin, 4);
  EXPECT_FALSE(l1.has_embedding || l1.has_head);
  // One tied table on rank 0 where the loop placement keeps a copy on the last rank: the V
  // pipeline holds one table's worth (vocabulary x width) fewer elements.
  const Config loop = grid_config(1, 1, 2, 2);
  const int64_t v_total = l0.flat_elements + l1.flat_elements;
  const int64_t loop_total = make_rank_layout(loop, 0).flat_elements + make_rank_layout(loop, 1).flat_elements;
  EXPECT_NEAR(static_cast<double>(loop_total - v_total),
              static_cast<double>(c.model.padded_vocab(1)) * c.model.d_model, 64.0);
}

// GradSync: the reduce group of every rank, and where the tied table's gradients meet.
TEST(RankLayout, GradSyncNamesTheGroupAndTheTiedTablesSync) {
  using Tied = GradSync::Tied;
  // The header's worked example: 8 ranks, distributed optimizer; rank 5 reduces over {5, 7}.
  Config c = grid_config(2, 2, 2, 1);
  c.parallel.distributed_optimizer = true;
  const RankLayout l5 = make_rank_layout(c, 5);
  ASSERT_EQ(l5.grad_sync.groups.size(), 1u);
  const ReduceGroup& g = l5.grad_sync.groups[0];
  EXPECT_EQ(g.axis, Axis::DPCP);
  EXPECT_EQ(g.size, 2);
  EXPECT_EQ(g.rank, 0);
  EXPECT_TRUE(g.sharded);
  EXPECT_EQ(l5.grad_sync.tied, Tied::PipelineEnds);  // the last stage's copy of the table
  EXPECT_EQ(l5.grad_sync.tied_table.size(), c.model.padded_vocab(2) / 2 * c.model.d_model);
  EXPECT_EQ(make_rank_layout(c, 7).grad_sync.groups[0].rank, 1);
  EXPECT_EQ(make_rank_layout(c, 1).grad_sync.tied, Tied::PipelineEnds);  // the first stage's copy
  // A middle stage holds no table; one stage holds it as any parameter; V: one table, two chunks.
  EXPECT_EQ(make_rank_layout(grid_config(1, 1, 4, 1), 2).grad_sync.tied, Tied::None);
  const RankLayout one = make_rank_layout(grid_config(1, 2, 1, 1), 1);
  EXPECT_EQ(one.grad_sync.tied, Tied::None);
  EXPECT_FALSE(one.grad_sync.groups[0].sharded);  // not without the distributed optimizer
  Config v = grid_config(1, 1, 2, 1);
  v.parallel.vp = 2;
  v.parallel.placement = Placement::V;
  v.parallel.schedule = ScheduleKind::Zbv;
  validate_layout(v, 2);
  EXPECT_EQ(make_rank_layout(v, 0).grad_sync.tied, Tied::Local);
  EXPECT_EQ(make_rank_layout(v, 1).grad_sync.tied, Tied::None);
  // An untied head (Llama): nothing to sum between the ends.
  Config untied = grid_config(1, 1, 2, 1);
  untied.model.tie_embeddings = false;
  EXPECT_EQ(make_rank_layout(untied, 0).grad_sync.tied, Tied::None);
}

TEST(RankLayout, DistributedOptimizerShardsCoverEveryBucketOnce) {
  for (bool distopt : {false, true}) {
    Config c = test::tiny_config(8);
    c.parallel.dp = 3;
    c.train.global_batch_size = 6;
    validate_layout(c, 3);
    c.parallel.distributed_optimizer = distopt;
    c.parallel.bucket_mb = 0.01;  // several buckets
    std::vector<RankLayout> ls;
    for (int r = 0; r < 3; ++r) ls.push_back(make_rank_layout(c, r));
    ASSERT_GT(ls[0].grad_sync.groups[0].buckets.size(), 1u);
    for (size_t b = 0; b < ls[0].grad_sync.groups[0].buckets.size(); ++b) {
      const FlatSpan s = ls[0].grad_sync.groups[0].buckets[b].span;
      int64_t covered = 0, at = s.begin;
      for (const RankLayout& l : ls) {
        const FlatSpan o = l.grad_sync.groups[0].owned[b];
        if (!distopt) {
          EXPECT_EQ(o.begin, s.begin);
          EXPECT_EQ(o.end, s.end);
          continue;
        }
        if (o.size() == 0) continue;
        EXPECT_EQ(o.begin, at) << "bucket " << b << " rank " << l.rank;  // contiguous, in DP order
        at = o.end;
        covered += o.size();
      }
      if (distopt) {
        EXPECT_EQ(covered, s.size()) << "bucket " << b;
      }
    }
  }
}

TEST(RankLayout, DpShardSplitsIntoCeilBlocks) {
  const FlatSpan s{100, 110};
  const std::vector<FlatSpan> want = {{100, 103}, {103, 106}, {106, 109}, {109, 110}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(dp_shard(s, 4, r).begin, want[r].begin) << r;
    EXPECT_EQ(dp_shard(s, 4, r).end, want[r].end) << r;
  }
  EXPECT_EQ(dp_shard({0, 2}, 4, 3).size(), 0);  // more ranks than elements: the last ones empty
}

TEST(RankLayout, AgreesWithTheModelBuiltFromIt) {
  for (bool llama : {false, true}) {
    Config c = grid_config(2, 1, 2, 1);
    if (llama) test::make_llama(c.model, 2);
    for (int r = 0; r < 4; ++r) {
      const RankLayout l = make_rank_layout(c, r);
      ParallelContext par;
      par.grid = l.grid;
      par.rank = r;
      par.coords = l.coords;
      auto ops = make_ops(Device::CPU);
      ParamRegistry reg;
      GptModel model(*ops, par, c.model, l.chunks, c.recompute, reg);
      EXPECT_EQ(reg.flat_size(), l.flat_elements) << "rank " << r;
      int64_t in_buckets = 0;
      for (const GradBucket& b : l.grad_sync.groups[0].buckets) in_buckets += b.param_elements;
      int64_t params = 0;
      for (const Param& p : reg.params()) params += p.numel();
      EXPECT_EQ(in_buckets, params) << "rank " << r;
    }
  }
}

TEST(RankLayout, EvalLayoutIsForwardOnlyAndReadsNoScheduleFile) {
  Config c = grid_config(1, 1, 2, 1);
  c.parallel.schedule_file = "/nonexistent/schedule.csv";
  const RankLayout l = make_eval_layout(c, 1);
  EXPECT_TRUE(l.schedule.forward_only);
  EXPECT_EQ(l.schedule.microbatches, 8);
  EXPECT_THROW(make_rank_layout(c, 1), InputError);  // the training layout reads the file
}

}  // namespace
}  // namespace tripod
