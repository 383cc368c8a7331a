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
#include "parallel/data_parallel/grad_sync.h"

namespace tripod {

class GradReducer {
 public:
  // Reduces `group` (its buckets, sharding and owned ranges as the rank layout made them) over
  // `comm`, the communicator of group.axis.
  GradReducer(Ops& ops, Communicator* comm, Tensor flat_grads, Tensor flat_values, const ReduceGroup& group);
  ~GradReducer();

  void begin_step();
  // The gradients of [begin, end) (one parameter) are final; launches its bucket when complete.
  void mark_ready(int64_t begin, int64_t end);
  // Launches what is left and waits for every bucket.
  void finish();
  // The ranges of the flat buffers this rank updates: everything, or its slice of each bucket.
  const std::vector<FlatSpan>& owned() const { return group_.owned; }
  // After the update of the owned ranges (shard mode): every rank gets every updated value.
  void all_gather_values();
  const std::vector<GradBucket>& buckets() const { return group_.buckets; }


 private:
  void launch(size_t b);
  Ops& ops_;
  Communicator* dp_;
  Tensor grads_, values_;
  const ReduceGroup group_;
  const bool shard_;
  std::vector<int64_t> ready_;
  std::vector<bool> launched_;
  struct Pending {
    std::unique_ptr<CommRequest> req;
    std::function<void()> done;
  };
  std::vector<Pending> pending_;
};

}  // namespace tripod
