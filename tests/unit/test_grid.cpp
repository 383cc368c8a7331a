// The rank grid against worked examples.
#include <gtest/gtest.h>

#include <algorithm>

#include "parallel/grid.h"

namespace tripod {
namespace {

using V = std::vector<int>;
using VV = std::vector<std::vector<int>>;

TEST(RankGrid, EightRanksTwoByTwoByTwo) {
  RankGrid g(/*tp=*/2, /*dp=*/2, /*pp=*/2);
  EXPECT_EQ(g.world_size(), 8);
  EXPECT_EQ(g.groups(Axis::TP), (VV{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.groups(Axis::DP), (VV{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.groups(Axis::PP), (VV{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.coords(5), (Coords{.tp = 1, .dp = 0, .pp = 1}));
  EXPECT_EQ(g.coords(6), (Coords{.tp = 0, .dp = 1, .pp = 1}));
  EXPECT_EQ(g.embedding_group(3), (V{3, 7}));
  EXPECT_EQ(g.embedding_group(7), (V{3, 7}));
}

TEST(RankGrid, TwelveRanksMixedSizes) {
  RankGrid g(/*tp=*/2, /*dp=*/3, /*pp=*/2);
  EXPECT_EQ(g.group(Axis::DP, 7), (V{7, 9, 11}));  // rank 7: tp 1, dp 0, pp 1
  EXPECT_EQ(g.group(Axis::PP, 3), (V{3, 9}));
  EXPECT_EQ(g.group(Axis::TP, 11), (V{10, 11}));
  for (int r = 0; r < g.world_size(); ++r) EXPECT_EQ(g.rank(g.coords(r)), r);
}

// Context parallelism sits between TP and DP: rank = tp + 2 (cp + 2 (dp + 2 pp)); gradients are
// reduced over DP x CP, cp fastest.
TEST(RankGrid, ContextParallelAxis) {
  RankGrid g(/*tp=*/2, /*dp=*/2, /*pp=*/2, /*cp=*/2);
  EXPECT_EQ(g.world_size(), 16);
  EXPECT_EQ(g.coords(6), (Coords{.tp = 0, .dp = 1, .pp = 0, .cp = 1}));
  EXPECT_EQ(g.groups(Axis::TP)[1], (V{2, 3}));
  EXPECT_EQ(g.groups(Axis::CP), (VV{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.group(Axis::DP, 3), (V{3, 7}));
  EXPECT_EQ(g.group(Axis::PP, 3), (V{3, 11}));
  EXPECT_EQ(g.group(Axis::DPCP, 5), (V{1, 3, 5, 7}));
  EXPECT_EQ(g.dpcp_rank(g.coords(5)), 2);  // cp 0, dp 1
  EXPECT_EQ(g.embedding_group(6), (V{6, 14}));
  for (int r = 0; r < g.world_size(); ++r) EXPECT_EQ(g.rank(g.coords(r)), r);
  EXPECT_EQ(g.str(), "(dp=2, pp=2, cp=2, tp=2)");
  EXPECT_EQ(RankGrid(2, 2, 2).str(), "(dp=2, pp=2, tp=2)");
}

// Expert parallelism folds each DP x CP group: ep consecutive members (by DP x CP index, cp
// fastest) split the experts, the members ep apart hold the same ones. The header's example.
TEST(RankGrid, ExpertParallelAxesFoldDataTimesContext) {
  RankGrid g(/*tp=*/2, /*dp=*/2, /*pp=*/1, /*cp=*/2, /*ep=*/2);
  EXPECT_EQ(g.world_size(), 8);
  EXPECT_EQ(g.group(Axis::DPCP, 0), (V{0, 2, 4, 6}));
  EXPECT_EQ(g.groups(Axis::EP), (VV{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.groups(Axis::EDP), (VV{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.ep_rank(g.coords(6)), 1);
  EXPECT_EQ(g.edp_rank(g.coords(6)), 1);
  EXPECT_EQ(g.size(Axis::EP), 2);
  EXPECT_EQ(g.size(Axis::EDP), 2);
  EXPECT_EQ(g.str(), "(dp=2, pp=1, cp=2, tp=2, ep=2)");
  // ep = dp x cp: one EP group per (tp, pp), EDP groups of one rank.
  RankGrid all(/*tp=*/1, /*dp=*/4, /*pp=*/2, /*cp=*/1, /*ep=*/4);
  EXPECT_EQ(all.group(Axis::EP, 5), (V{4, 5, 6, 7}));
  EXPECT_EQ(all.group(Axis::EDP, 5), (V{5}));
  // ep = 1: EP is every rank alone and EDP is DP x CP.
  RankGrid none(2, 2, 1, 2);
  EXPECT_EQ(none.group(Axis::EDP, 3), none.group(Axis::DPCP, 3));
  EXPECT_EQ(none.group(Axis::EP, 3), (V{3}));
  for (const RankGrid& x : {g, all, none})
    for (int r = 0; r < x.world_size(); ++r) {
      // Every rank of a DP x CP group is in exactly one EP and one EDP group inside it.
      const V dpcp = x.group(Axis::DPCP, r), ep = x.group(Axis::EP, r), edp = x.group(Axis::EDP, r);
      for (int q : ep) EXPECT_NE(std::find(dpcp.begin(), dpcp.end(), q), dpcp.end());
      for (int q : edp) EXPECT_NE(std::find(dpcp.begin(), dpcp.end(), q), dpcp.end());
      EXPECT_EQ(ep.size() * edp.size(), dpcp.size());
    }
  EXPECT_THROW(RankGrid(1, 3, 1, 1, 2), std::exception);  // ep must divide dp x cp
}

TEST(RankGrid, SerialAndPipelineOnly) {
  RankGrid s(1, 1, 1);
  EXPECT_EQ(s.group(Axis::TP, 0), (V{0}));
  EXPECT_EQ(s.embedding_group(0), (V{0}));
  RankGrid p(1, 1, 4);
  EXPECT_EQ(p.group(Axis::PP, 2), (V{0, 1, 2, 3}));
  EXPECT_EQ(p.embedding_group(0), (V{0, 3}));
}

TEST(RankGrid, RefusesBadSizes) {
  EXPECT_THROW(RankGrid(0, 1, 1), std::exception);
  EXPECT_THROW(RankGrid(2, 2, 2).coords(8), std::exception);
}

}  // namespace
}  // namespace tripod
