// Gradient synchronisation values: sharding, buckets.
#include "parallel/data_parallel/grad_sync.h"

#include <algorithm>

namespace tripod {

FlatSpan dp_shard(const FlatSpan& s, int n, int rank) {
  const int64_t per = (s.size() + n - 1) / n;
  const int64_t b = std::min(s.end, s.begin + rank * per), e = std::min(s.end, b + per);
  return {b, e};
}

int64_t ReduceGroup::owned_elements() const {
  int64_t n = 0;
  for (const FlatSpan& s : owned) n += s.size();
  return n;
}

int64_t GradSync::owned_elements() const {
  int64_t n = 0;
  for (const ReduceGroup& g : groups) n += g.owned_elements();
  return n;
}

std::vector<GradBucket> make_buckets(const std::vector<FlatSpan>& params, int64_t bucket_elements,
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
