// Bucketed DP all-reduce / reduce-scatter of gradients.
#include "parallel/data_parallel/grad_reducer.h"

#include <algorithm>

namespace tripod {

GradReducer::GradReducer(Ops& ops, Communicator* comm, Tensor flat_grads, Tensor flat_values, const ReduceGroup& group)
    : ops_(ops), dp_(comm), grads_(std::move(flat_grads)), values_(std::move(flat_values)), group_(group),
      shard_(group.sharded) {
  TRIPOD_CHECK(group_.size == (dp_ ? dp_->size() : 1) && group_.rank == (dp_ ? dp_->rank() : 0),
               "reduce group of {} ranks (this one {}) on a communicator of {} ranks (this one {})", group_.size,
               group_.rank, dp_ ? dp_->size() : 1, dp_ ? dp_->rank() : 0);
  TRIPOD_CHECK(group_.owned.size() == group_.buckets.size(), "{} owned ranges for {} buckets", group_.owned.size(),
               group_.buckets.size());
  ready_.assign(group_.buckets.size(), 0);
  launched_.assign(group_.buckets.size(), false);
}



GradReducer::~GradReducer() {
  for (auto& p : pending_) p.req.reset();  // completes abandoned requests
}


void GradReducer::begin_step() {
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(launched_.begin(), launched_.end(), false);
}

void GradReducer::mark_ready(int64_t begin, int64_t end) {
  auto it = std::upper_bound(group_.buckets.begin(), group_.buckets.end(), begin,
                             [](int64_t v, const GradBucket& b) { return v < b.span.begin; });
  TRIPOD_CHECK(it != group_.buckets.begin(), "gradient range [{}, {}) is in no bucket", begin, end);
  size_t b = static_cast<size_t>(it - group_.buckets.begin()) - 1;
  TRIPOD_CHECK(end <= group_.buckets[b].span.end, "gradient range [{}, {}) crosses a bucket end {}", begin, end,
               group_.buckets[b].span.end);
  ready_[b] += end - begin;
  TRIPOD_CHECK(ready_[b] <= group_.buckets[b].param_elements, "bucket {} marked ready twice", b);
  if (ready_[b] == group_.buckets[b].param_elements) launch(b);
}

void GradReducer::launch(size_t b) {
  if (launched_[b]) return;
  launched_[b] = true;
  if (!dp_ || dp_->size() == 1) return;
  const FlatSpan& s = group_.buckets[b].span;
  if (!shard_) {
    Tensor g = grads_.flat(s.begin, s.end);
    pending_.push_back({dp_->iall_reduce(g), {}});
    return;
  }
  // Reduce-scatter over a padded copy (dp equal blocks), then the owned block goes back in place.
  const int64_t n = dp_->size(), per = (s.size() + n - 1) / n;
  Tensor in = ops_.empty({n * per}, DType::F32, MemCategory::Comm);
  if (n * per != s.size()) ops_.fill(in, 0.f);
  Tensor in_head = in.flat(0, s.size());
  ops_.copy(grads_.flat(s.begin, s.end), in_head);
  Tensor out = ops_.empty({per}, DType::F32, MemCategory::Comm);
  FlatSpan own = group_.owned[b];
  auto req = dp_->ireduce_scatter(in, out);
  pending_.push_back({std::move(req), [this, in, out, own]() {
                        Tensor dst = grads_.flat(own.begin, own.end);
                        ops_.copy(out.flat(0, own.size()), dst);
                      }});
}

void GradReducer::finish() {
  for (size_t b = 0; b < group_.buckets.size(); ++b) launch(b);
  for (auto& p : pending_) {
    p.req->wait();
    if (p.done) p.done();
  }
  pending_.clear();
}

void GradReducer::all_gather_values() {
  if (!shard_) return;
  const int64_t n = dp_->size();
  for (size_t b = 0; b < group_.buckets.size(); ++b) {
    const FlatSpan& s = group_.buckets[b].span;
    const int64_t per = (s.size() + n - 1) / n;
    Tensor in = ops_.empty({per}, values_.dtype(), MemCategory::Comm);
    Tensor in_head = in.flat(0, group_.owned[b].size());
    ops_.copy(values_.flat(group_.owned[b].begin, group_.owned[b].end), in_head);
    Tensor out = ops_.empty({n * per}, values_.dtype(), MemCategory::Comm);
    dp_->all_gather(in, out);
    Tensor dst = values_.flat(s.begin, s.end);
    ops_.copy(out.flat(0, s.size()), dst);
  }
}


}  // namespace tripod
