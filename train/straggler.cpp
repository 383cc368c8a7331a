// Straggler detection: one all-gather of per-rank times per log interval and the median rule.
#include "train/straggler.h"

#include <algorithm>

#include "core/allocator.h"
#include "core/error.h"
#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace tripod {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

StragglerMonitor::StragglerMonitor(double factor, std::vector<int> work_class)
    : factor_(factor), class_(std::move(work_class)), over_(class_.size(), 0) {
  TRIPOD_CHECK(factor > 1 && !class_.empty(), "straggler factor {} (must be > 1), world {}", factor, class_.size());
}

void StragglerMonitor::add_step(double step_s, double compute_s) {
  step_sum_ += step_s;
  compute_sum_ += compute_s;
  ++steps_;
}

StragglerSummary StragglerMonitor::gather(Communicator& world, int64_t step) {
  const int n = world.size();
  TRIPOD_CHECK(n == static_cast<int>(over_.size()), "straggler monitor for {} ranks on a world of {}", over_.size(), n);
  CpuAllocator host;
  Tensor mine = Tensor::empty(host, {2}, DType::F64, MemCategory::Workspace);
  Tensor all = Tensor::empty(host, {2 * static_cast<int64_t>(n)}, DType::F64, MemCategory::Workspace);  // (world, 2)
  const double k = steps_ > 0 ? static_cast<double>(steps_) : 1.0;
  mine.data<double>()[0] = step_sum_ / k;
  mine.data<double>()[1] = compute_sum_ / k;
  world.all_gather(mine, all);
  step_sum_ = compute_sum_ = 0;
  steps_ = 0;
  std::vector<RankTimes> times(n);
  for (int r = 0; r < n; ++r) times[r] = {all.data<double>()[2 * r], all.data<double>()[2 * r + 1]};
  return update(step, times);
}

StragglerSummary StragglerMonitor::update(int64_t step, const std::vector<RankTimes>& times) {
  TRIPOD_CHECK(times.size() == over_.size(), "{} ranks' times for a monitor of {}", times.size(), over_.size());
  StragglerSummary s;
  s.step = step;
  std::vector<double> compute, steps;
  for (const RankTimes& t : times) {
    compute.push_back(t.compute_s);
    steps.push_back(t.step_s);
  }
  s.median_compute_s = median(compute);
  s.median_step_s = median(steps);
  s.max_rank = static_cast<int>(std::max_element(compute.begin(), compute.end()) - compute.begin());
  s.max_compute_s = compute[s.max_rank];
  const int n = static_cast<int>(times.size());
  for (int r = 0; r < n; ++r) {
    const bool was = over_[r] >= kIntervals;
    std::vector<double> equals;  // the other ranks doing the same work
    for (int q = 0; q < n; ++q)
      if (q != r && class_[q] == class_[r]) equals.push_back(compute[q]);
    const double ref = equals.empty() ? 0 : median(equals);
    // Nobody to compare with, or a median of 0 (nothing timed), makes no rank slow.
    const bool over = ref > 0 && compute[r] > factor_ * ref;
    over_[r] = over ? over_[r] + 1 : 0;
    if (over_[r] >= kIntervals) {
      s.stragglers.push_back({r, compute[r], compute[r] / ref, over_[r]});
      if (!was) s.named.push_back(r);
    } else if (was) {
      s.cleared.push_back(r);
    }
  }
  return s;
}

}  // namespace tripod
