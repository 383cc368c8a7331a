// Rank grid arithmetic.
#include "parallel/grid.h"

#include <fmt/format.h>

#include "core/error.h"

namespace tripod {

RankGrid::RankGrid(int tp, int dp, int pp, int cp, int ep) : tp_(tp), dp_(dp), pp_(pp), cp_(cp), ep_(ep) {
  TRIPOD_CHECK(tp >= 1 && dp >= 1 && pp >= 1 && cp >= 1 && ep >= 1,
               "grid sizes must be positive, got tp={} dp={} pp={} cp={} ep={}", tp, dp, pp, cp, ep);
  TRIPOD_CHECK((dp * cp) % ep == 0, "ep={} must divide dp x cp = {} x {}", ep, dp, cp);
}

int RankGrid::size(Axis a) const {
  switch (a) {
    case Axis::TP: return tp_;
    case Axis::DP: return dp_;
    case Axis::PP: return pp_;
    case Axis::CP: return cp_;
    case Axis::DPCP: return dp_ * cp_;
    case Axis::EP: return ep_;
    case Axis::EDP: return dp_ * cp_ / ep_;
  }
  return 1;
}

Coords RankGrid::coords(int rank) const {
  TRIPOD_CHECK(rank >= 0 && rank < world_size(), "rank {} outside a grid of {} ranks", rank, world_size());
  Coords c;
  c.tp = rank % tp_;
  c.cp = (rank / tp_) % cp_;
  c.dp = (rank / (tp_ * cp_)) % dp_;
  c.pp = rank / (tp_ * cp_ * dp_);
  return c;
}

std::vector<int> RankGrid::group(Axis axis, int rank) const {
  Coords c = coords(rank);
  // The members' DP x CP index j as coordinates (cp fastest).
  auto at_dpcp = [&](Coords o, int j) {
    o.cp = j % cp_;
    o.dp = j / cp_;
    return o;
  };
  std::vector<int> ranks;
  for (int i = 0; i < size(axis); ++i) {
    Coords o = c;
    switch (axis) {
      case Axis::TP: o.tp = i; break;
      case Axis::DP: o.dp = i; break;
      case Axis::PP: o.pp = i; break;
      case Axis::CP: o.cp = i; break;
      case Axis::DPCP: o = at_dpcp(c, i); break;
      case Axis::EP: o = at_dpcp(c, edp_rank(c) * ep_ + i); break;
      case Axis::EDP: o = at_dpcp(c, i * ep_ + ep_rank(c)); break;
    }
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
  Coords first = c, last = c;
  first.pp = 0;
  last.pp = pp_ - 1;
  return {this->rank(first), this->rank(last)};
}

std::string RankGrid::str() const {
  return fmt::format("(dp={}, pp={}{}, tp={}{})", dp_, pp_, cp_ > 1 ? fmt::format(", cp={}", cp_) : "", tp_,
                     ep_ > 1 ? fmt::format(", ep={}", ep_) : "");
}

}  // namespace tripod
