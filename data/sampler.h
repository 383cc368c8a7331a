// Which samples a data-parallel rank reads: a pure function of the number of samples consumed
// before the step (the sampler's whole state) and the rank's place, Megatron's order. A step
// takes global samples [consumed, consumed + global_batch); micro-step m of it takes the
// micro_batch * dp samples after consumed + m * micro_batch * dp, DP rank d the d-th run of
// micro_batch of those. E.g. global 8, micro 2, dp 2: micro-step 1 of the step at consumed 16
// gives rank 0 samples 20, 21 and rank 1 samples 22, 23.
#pragma once

#include <cstdint>

#include "core/error.h"

namespace tripod {

struct SampleOrder {
  int64_t global_batch = 1, micro_batch = 1;
  int dp = 1;

  int micro_steps() const {
    TRIPOD_CHECK(global_batch % (micro_batch * dp) == 0, "global batch {} is not a multiple of micro batch {} x dp {}",
                 global_batch, micro_batch, dp);
    return static_cast<int>(global_batch / (micro_batch * dp));
  }
  // Global index of sample b of micro-step `micro` on DP rank `dp_rank`, for the step that starts
  // after `consumed` samples.
  int64_t index(int64_t consumed, int micro, int dp_rank, int64_t b) const {
    return consumed + (static_cast<int64_t>(micro) * dp + dp_rank) * micro_batch + b;
  }
};

}  // namespace tripod
