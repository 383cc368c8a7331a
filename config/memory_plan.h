// The analytic memory of every rank for a config and grid, computed before anything is
// allocated, from the rank's layout (config/layout.h, the value the run itself is built from):
// parameters, gradients and optimizer states from its flat buffers and owned spans, activations
// by walking its pipeline plan with the bytes each chunk keeps (model/memory_estimate.h).
// `tripod train --dry-run` and `tripod schedule --config` print it.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "config/layout.h"
#include "parallel/grid.h"

namespace tripod {

struct RankMemory {
  int rank = 0;
  Coords coords;
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
  int64_t total() const { return params + grads + optimizer + activations; }
};

// `cfg` must have passed validate_layout(). The compute dtype and whether attention keeps its
// probabilities follow train.device (CPU: f32, kept; CUDA: bf16, recomputed by the fused kernel).
RankMemory plan_rank_memory(const Config& cfg, const RankLayout& layout);
RankMemory plan_rank_memory(const Config& cfg, int rank);
std::vector<RankMemory> plan_memory(const Config& cfg);
// The same for `schedule` (e.g. the one schedule = "auto" built) instead of make_schedule(cfg).
std::vector<RankMemory> plan_memory(const Config& cfg, const Schedule& schedule);
// A table of the ranks' estimates (one row per distinct (pp, tp) position; DP replicas agree
// except under the distributed optimizer, where the largest shard is shown).
std::string memory_table(const Config& cfg, const std::vector<RankMemory>& ranks);

}  // namespace tripod
