// AdamW over the flat parameter buffers, on the ranges this rank owns (all of them, or its DP
// shard with the distributed optimizer). f32 master weights and moments; on a backend whose
// compute dtype is not f32 the master copy is separate and the compute copy refreshed each step.
#pragma once

#include <vector>

#include "kernels/op.h"
#include "model/param_registry.h"
#include "parallel/data_parallel/grad_reducer.h"

namespace tripod {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(Ops& ops, ParamRegistry& reg, std::vector<FlatSpan> owned, const AdamWConfig& cfg, uint64_t init_seed);
  // One update with learning rate `lr`; step is 1-based; grads are multiplied by grad_scale.
  void step(double lr, int64_t step, float grad_scale);
  // Sum of squared gradients over the owned ranges of parameters for which `counts` is true.
  double grad_sq_sum(const std::function<bool(const ParamSpec&)>& counts);
  // Updates applied so far (Adam's bias correction counts these; skipped steps are not counted).
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t n) { steps_ = n; }

  // The state per owned span (for checkpoints): master (undefined when the values are the master),
  // first and second moments.
  struct Shard {
    FlatSpan span;
    Tensor master, m, v;
    std::vector<FlatRange> ranges;  // parameter pieces in span-relative offsets, with their decay
  };
  std::vector<Shard>& shards() { return shards_; }

 private:
  Ops& ops_;
  ParamRegistry& reg_;
  AdamWConfig cfg_;
  std::vector<Shard> shards_;
  int64_t steps_ = 0;
};

}  // namespace tripod
