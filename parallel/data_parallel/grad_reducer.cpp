// Bucketed DP all-reduce / reduce-scatter of gradients.
#include "parallel/data_parallel/grad_reducer.h"

#include <algorithm>

namespace tripod {

GradReducer::GradReducer(Ops& ops, Communicator* dp, Tensor flat_grads, Tensor flat_values,
                         std::vector<GradBucket> buckets, bool shard)
    : ops_(ops), dp_(dp), grads_(std::move(flat_grads)), values_(std::move(flat_values)),
      buckets_(std::move(buckets)), shard_(shard && dp && dp->size() > 1) {
  for (const GradBucket& b : buckets_) owned_.push_back(shard_ ? dp_shard(b.span, dp_->size(), dp_->rank()) : b.span);
  ready_.assign(buckets_.size(), 0);
  launched_.assign(buckets_.size(), false);
}

GradReducer::~GradReducer() {
  for (auto& p : pending_) p.req.reset();  // completes abandoned requests
}

FlatSpan dp_shard(const FlatSpan& s, int dp, int dp_rank) {
  const int64_t per = (s.size() + dp - 1) / dp;
  const int64_t b = std::min(s.end, s.begin + dp_rank * per), e = std::min(s.end, b + per);
  return {b, e};
}

void GradReducer::begin_step() {
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(launched_.begin(), launched_.end(), false);
}

void GradReducer::mark_ready(int64_t begin, int64_t end) {
  auto it = std::upper_bound(buckets_.begin(), buckets_.end(), begin,
                             [](int64_t v, const GradBucket& b) { return v < b.span.begin; });
  TRIPOD_CHECK(it != buckets_.begin(), "gradient range [{}, {}) is in no bucket", begin, end);
  size_t b = static_cast<size_t>(it - buckets_.begin()) - 1;
  TRIPOD_CHECK(end <= buckets_[b].span.end, "gradient range [{}, {}) crosses a bucket end {}", begin, end,
               buckets_[b].span.end);
  ready_[b] += end - begin;
  TRIPOD_CHECK(ready_[b] <= buckets_[b].param_elements, "bucket {} marked ready twice", b);
  if (ready_[b] == buckets_[b].param_elements) launch(b);
}

void GradReducer::launch(size_t b) {
  if (launched_[b]) return;
  launched_[b] = true;
  if (!dp_ || dp_->size() == 1) return;
  const FlatSpan& s = buckets_[b].span;
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
  FlatSpan own = owned_[b];
  auto req = dp_->ireduce_scatter(in, out);
  pending_.push_back({std::move(req), [this, in, out, own]() {
                        Tensor dst = grads_.flat(own.begin, own.end);
                        ops_.copy(out.flat(0, own.size()), dst);
                      }});
}

void GradReducer::finish() {
  for (size_t b = 0; b < buckets_.size(); ++b) launch(b);
  for (auto& p : pending_) {
    p.req->wait();
    if (p.done) p.done();
  }
  pending_.clear();
}

void GradReducer::all_gather_values() {
  if (!shard_) return;
  const int64_t n = dp_->size();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const FlatSpan& s = buckets_[b].span;
    const int64_t per = (s.size() + n - 1) / n;
    Tensor in = ops_.empty({per}, values_.dtype(), MemCategory::Comm);
    Tensor in_head = in.flat(0, owned_[b].size());
    ops_.copy(values_.flat(owned_[b].begin, owned_[b].end), in_head);
    Tensor out = ops_.empty({n * per}, values_.dtype(), MemCategory::Comm);
    dp_->all_gather(in, out);
    Tensor dst = values_.flat(s.begin, s.end);
    ops_.copy(out.flat(0, s.size()), dst);
  }
}

std::vector<GradBucket> GradReducer::make_buckets(const std::vector<FlatSpan>& params, int64_t bucket_elements,
                                                  const std::vector<int>& boundaries_after) {
  std::vector<GradBucket> out;
  GradBucket cur{{0, 0}, 0};
  bool open = false;
  auto close = [&] {
    if (open) out.push_back(cur);
    open = false;
  };
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const FlatSpan& p = params[i];
    if (!open) {
      cur = {p, 0};
      open = true;
    }
    cur.span.begin = std::min(cur.span.begin, p.begin);
    cur.span.end = std::max(cur.span.end, p.end);
    cur.param_elements += p.size();
    bool boundary = std::find(boundaries_after.begin(), boundaries_after.end(), i - 1) != boundaries_after.end();
    if (cur.param_elements >= bucket_elements || boundary) close();
  }
  close();
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace tripod
