// Stragglers: ranks whose compute time per step stays above that of the ranks doing the same work.
//
// Every rank sums its step time and its compute time (the forward and backward work of its
// pipeline actions, on the backend's compute clock: Ops::compute_begin) over a log interval; at
// the interval's end one all-gather of two numbers per rank gives every rank the same table, and
// each applies the same rule. Ranks are compared only with their equals: the ranks of the same
// work class (the layout's pipeline stage: the same chunks, across dp, cp and tp), since another
// stage may simply do more (the last one computes the head and the loss). A rank whose compute
// time per step exceeds `factor` x the median of the other ranks of its class for kIntervals
// intervals in a row is a straggler (named until an interval finds it back under the bar); a rank
// alone in its class (tp = cp = dp = 1) has nobody to be compared with. Compute time, not step
// time, tells them apart: at every synchronisation the others wait for the slow rank, so their
// step times match its own.
//
// Example (factor 1.3, 4 ranks, two stages of two ranks; the second stage holds the head; compute
// ms per step over three intervals):
//   rank (stage)  0 (0)  1 (0)  2 (1)  3 (1)
//   #1             10     21     14     14    rank 1 over rank 0 (2.1x), 1 interval in a row
//   #2             10     20     15     14    rank 1 over, 2; rank 2 within 1.07x of rank 3
//   #3             11     22     14     14    rank 1 over, 3 -> named; stage 1 is slower, not slow
#pragma once

#include <cstdint>
#include <vector>

namespace tripod {

class Communicator;

struct RankTimes {
  double step_s = 0, compute_s = 0;  // per step, averaged over the interval
};

struct Straggler {
  int rank = 0;
  double compute_s = 0, ratio = 0;  // its compute time per step, and that over its equals' median
  int intervals = 0;                // consecutive intervals over the bar, this one included
};

// One log interval's verdict: the same on every rank.
struct StragglerSummary {
  int64_t step = 0;                 // the interval's last step
  double median_compute_s = 0, max_compute_s = 0, median_step_s = 0;  // over all ranks
  int max_rank = 0;                 // the rank with the longest compute time
  std::vector<Straggler> stragglers;  // over the bar for >= kIntervals intervals in a row
  std::vector<int> named, cleared;    // ranks that became stragglers / stopped being ones here
};

class StragglerMonitor {
 public:
  static constexpr int kIntervals = 3;

  // `factor` > 1: the bar over the equals' median; `work_class[r]`: rank r's class (its pipeline
  // stage), one entry per rank of the world.
  StragglerMonitor(double factor, std::vector<int> work_class);

  // This rank's times of one step (seconds).
  void add_step(double step_s, double compute_s);
  // Collective over `world` (every rank, at the same step): gathers the per-step means since the
  // last gather and returns update()'s verdict.
  StragglerSummary gather(Communicator& world, int64_t step);
  // Folds one interval's per-rank times in (a pure function of the times so far).
  StragglerSummary update(int64_t step, const std::vector<RankTimes>& times);

 private:
  double factor_;
  std::vector<int> class_;  // per rank: its work class
  std::vector<int> over_;   // per rank: consecutive intervals over the bar
  double step_sum_ = 0, compute_sum_ = 0;
  int64_t steps_ = 0;
};

}  // namespace tripod
