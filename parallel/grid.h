// The (DP, PP, TP) rank grid as a value: sizes, coordinates and axis groups, as pure functions.
//
// Order: tp fastest, then dp, then pp, so a TP group is a run of consecutive ranks (one node),
// and pipeline stages are the slowest axis (they span nodes). Worked example, 8 ranks,
// tp=2 dp=2 pp=2:
//   rank:   0 1 2 3 4 5 6 7
//   tp:     0 1 0 1 0 1 0 1
//   dp:     0 0 1 1 0 0 1 1
//   pp:     0 0 0 0 1 1 1 1
//   TP groups {0,1} {2,3} {4,5} {6,7}; DP groups {0,2} {1,3} {4,6} {5,7};
//   PP groups {0,4} {1,5} {2,6} {3,7}.
#pragma once

#include <string>
#include <vector>

namespace tripod {

enum class Axis { TP, DP, PP };

struct Coords {
  int tp = 0, dp = 0, pp = 0;
  bool operator==(const Coords&) const = default;
};

class RankGrid {
 public:
  RankGrid() = default;
  RankGrid(int tp, int dp, int pp);

  int tp() const { return tp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int world_size() const { return tp_ * dp_ * pp_; }
  int size(Axis a) const { return a == Axis::TP ? tp_ : a == Axis::DP ? dp_ : pp_; }

  Coords coords(int rank) const;
  int rank(Coords c) const { return c.tp + tp_ * (c.dp + dp_ * c.pp); }
  // The ranks of `rank`'s group along `axis`, in order of their coordinate on that axis.
  std::vector<int> group(Axis axis, int rank) const;
  // All groups along an axis, each in coordinate order (what MPI_Comm_split is driven by).
  std::vector<std::vector<int>> groups(Axis axis) const;
  // The ranks holding the tied embedding (first and last pipeline stage) for rank's (tp, dp).
  std::vector<int> embedding_group(int rank) const;

  std::string str() const;  // "(dp=2, pp=2, tp=2)"
  bool operator==(const RankGrid&) const = default;

 private:
  int tp_ = 1, dp_ = 1, pp_ = 1;
};

}  // namespace tripod
