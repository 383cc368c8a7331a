// Data-parallel gradient reduction in buckets over the flat gradient buffer. A bucket is launched
// (non-blocking) as soon as all its gradients are final, so communication overlaps the rest of the
// backward. With `shard` (the distributed optimizer, ZeRO-1) buckets are reduce-scattered: DP rank
// r ends up with the summed gradients of its 1/dp slice of every bucket, updates only that slice,
// and the updated values are all-gathered back.
//
// Gradients arrive pre-scaled by 1/(tokens in the global batch), so summing is averaging.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "kernels/op.h"
#include "parallel/comm/communicator.h"

namespace tripod {

struct FlatSpan {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// DP rank `dp_rank`'s slice of `s` under the distributed optimizer: `s` cut into dp blocks of
// ceil(size / dp) elements, the last ones short or empty. Example: 10 elements over dp = 4 ->
// [0, 3) [3, 6) [6, 9) [9, 10).
FlatSpan dp_shard(const FlatSpan& s, int dp, int dp_rank);

struct GradBucket {
  FlatSpan span;             // range of the flat buffers
  int64_t param_elements;    // elements of the parameters inside (the span less alignment gaps)
};

class GradReducer {
 public:
  GradReducer(Ops& ops, Communicator* dp, Tensor flat_grads, Tensor flat_values, std::vector<GradBucket> buckets,
              bool shard);
  ~GradReducer();

  void begin_step();
  // The gradients of [begin, end) (one parameter) are final; launches its bucket when complete.
  void mark_ready(int64_t begin, int64_t end);
  // Launches what is left and waits for every bucket.
  void finish();
  // The ranges of the flat buffers this rank updates: everything, or its slice of each bucket.
  const std::vector<FlatSpan>& owned() const { return owned_; }
  // After the update of the owned ranges (shard mode): every rank gets every updated value.
  void all_gather_values();
  const std::vector<GradBucket>& buckets() const { return buckets_; }

  // Buckets of about `bucket_elements` from parameter ranges listed in registration order; filled
  // back to front (the backward finishes the last parameters first). No bucket holds both
  // parameter j and j+1 for j in `boundaries_after`.
  static std::vector<GradBucket> make_buckets(const std::vector<FlatSpan>& params, int64_t bucket_elements,
                                              const std::vector<int>& boundaries_after = {});

 private:
  void launch(size_t b);
  Ops& ops_;
  Communicator* dp_;
  Tensor grads_, values_;
  std::vector<GradBucket> buckets_;
  bool shard_;
  std::vector<FlatSpan> owned_;
  std::vector<int64_t> ready_;
  std::vector<bool> launched_;
  struct Pending {
    std::unique_ptr<CommRequest> req;
    std::function<void()> done;
  };
  std::vector<Pending> pending_;
};

}  // namespace tripod
