// Rank grid arithmetic.
#include "parallel/grid.h"

#include <fmt/format.h>

#include "core/error.h"

namespace tripod {

RankGrid::RankGrid(int tp, int dp, int pp) : tp_(tp), dp_(dp), pp_(pp) {
  TRIPOD_CHECK(tp >= 1 && dp >= 1 && pp >= 1, "grid sizes must be positive, got tp={} dp={} pp={}", tp, dp, pp);
}

Coords RankGrid::coords(int rank) const {
  TRIPOD_CHECK(rank >= 0 && rank < world_size(), "rank {} outside a grid of {} ranks", rank, world_size());
  return {rank % tp_, (rank / tp_) % dp_, rank / (tp_ * dp_)};
}

std::vector<int> RankGrid::group(Axis axis, int rank) const {
  Coords c = coords(rank);
  std::vector<int> ranks;
  for (int i = 0; i < size(axis); ++i) {
    Coords o = c;
    (axis == Axis::TP ? o.tp : axis == Axis::DP ? o.dp : o.pp) = i;
    ranks.push_back(this->rank(o));
  }
  return ranks;
}

std::vector<std::vector<int>> RankGrid::groups(Axis axis) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_size(); ++r) {
    auto g = group(axis, r);
    if (g.front() == r) out.push_back(std::move(g));
  }
  return out;
}

std::vector<int> RankGrid::embedding_group(int rank) const {
  Coords c = coords(rank);
  if (pp_ == 1) return {rank};
  return {this->rank({c.tp, c.dp, 0}), this->rank({c.tp, c.dp, pp_ - 1})};
}

std::string RankGrid::str() const { return fmt::format("(dp={}, pp={}, tp={})", dp_, pp_, tp_); }

}  // namespace tripod
