// The layout search of `tripod plan`: every (tp, pp, vp, cp, dp, micro-batch, recompute, sequence
// parallelism, distributed optimizer, and for a mixture of experts ep) that tripod accepts for a
// model on a number of GPUs, the ones whose memory fits the device, ranked by the cost model's
// predicted step time.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "plan/cost_model.h"
#include "plan/hardware.h"
#include "config/config.h"

namespace tripod {

// Knobs fixed by `--layout` (the rest are searched).
struct LayoutFilter {
  std::optional<int> tp, pp, vp, cp, ep, micro_batch;
  std::optional<RecomputeMode> recompute;
  std::optional<bool> sequence_parallel, distributed_optimizer;
  std::vector<ScheduleKind> schedules;  // empty: every candidate of schedule_candidates
  bool balanced = true;  // layers_per_stage = "auto" (false: an even split, layouts it does not divide refused)
};
// "tp=8,pp=4,vp=2,cp=2,ep=4,mbs=1,recompute=full,sp=true,distopt=false,split=even"; InputError naming
// the bad item.
LayoutFilter parse_layout_filter(const std::string& text);

struct PlannedLayout {
  Config cfg;  // validated for the GPUs: parallel.*, train.micro_batch_size, recompute.mode set
  StepPrediction pred;
};

struct PlanResult {
  std::vector<PlannedLayout> layouts;  // those that fit, fastest first
  int valid = 0;                       // layouts tripod accepts, fitting or not
  std::optional<PlannedLayout> smallest;  // the least memory among all valid layouts
};

// The schedules the search tries for pp stages and vp chunks per rank (each on its
// default_placement): 1F1B and ZB-H1 (vp = 1, pp > 1), interleaved and ZB-V (vp = 2),
// interleaved (vp > 2).
std::vector<ScheduleKind> schedule_candidates(int pp, int vp);

// Every layout of `base.model` (with base.train.global_batch_size sequences per step) on `gpus`
// devices of `hw`. InputError when the GPUs are not whole nodes, or no layout divides the global
// batch (or matches `fixed`).
PlanResult plan_layouts(const Config& base, const Hardware& hw, int gpus, const LayoutFilter& fixed = {},
                        int max_micro_batch = 32);

// The layout as the config sections to paste: [parallel] (with the layer split), [train]
// micro/global batch, [recompute].
std::string layout_toml(const Config& cfg);

}  // namespace tripod
