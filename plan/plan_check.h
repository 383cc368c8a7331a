// The planner checked by a run: RUN_DIR/plan_check.json holds a training run's profiled steps
// (train.profile_steps) by where their time went (kernels/op_timing.h's StepBreakdown: GEMMs,
// attention, memory-bound ops, exposed communication, pipeline idle, optimizer) next to the cost
// model's prediction for the run's layout, schedule and hardware file. `tripod plan --check`
// prints it (predicted again on another hardware file with --hardware) and the report shows it.
//
// The file is one JSON object (also what `tripod plan --check --json` prints):
//   {"version": 1, "hardware": NAME, "hardware_file": PATH or "", "steps": [profiled steps],
//    "layout": {tp, pp, vp, cp, dp, schedule, placement, micro_batch, microbatches, recompute,
//               sequence_parallel, distributed_optimizer},
//    "step": {"predicted": S, "measured": S, "error": E}, "gemm": {...}, "attention": {...},
//    "elementwise", "communication", "pipeline_idle", "optimizer", "other": the same,
//    "pipeline_ranks": [{"pp": Q, "predicted": {FAMILY: S, ..., "step": S}, "measured": {...}}],
//    "ranks": [{"rank": R, "pp", "dp", "cp", "tp", "measured": {...}}]}
// Seconds per step; the families are means over the ranks (pipeline_ranks: over each pipeline
// rank's ranks); error = predicted / measured - 1 (null when nothing was measured). A rank's
// measured communication beyond the least of its pipeline stage's ranks is counted as its idle
// (waiting for a slower rank).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "kernels/op_timing.h"
#include "parallel/pipeline/schedules.h"
#include "plan/hardware.h"

namespace tripod {

inline constexpr const char* kPlanCheckFile = "plan_check.json";

struct PlanCheck {
  std::string hardware;       // the name of the hardware the prediction used
  std::string hardware_file;  // its file; "" for the built-in figures of train.device
  std::vector<int64_t> steps;  // the profiled steps
  nlohmann::json layout;       // the run's layout, for people (tp, pp, ..., schedule, micro-batches)
  StepBreakdown predicted, measured;               // means over the ranks
  std::vector<StepBreakdown> predicted_stages, measured_stages;  // per pipeline rank
  std::vector<StepBreakdown> measured_ranks;       // every rank, in world order
};

// The check of a run whose resolved config is `cfg` (validated for its grid, the layer split
// resolved: the run's config.toml), which ran `schedule`: the measured breakdown of every rank
// (world order: each rank's median profiled step) beside predict_step's on `hw` (read from
// `hardware_file`, "" for the built-in figures).
PlanCheck make_plan_check(const Config& cfg, const Schedule& schedule, const Hardware& hw,
                          const std::string& hardware_file, std::vector<int64_t> steps,
                          std::vector<StepBreakdown> measured_ranks);
// The prediction part again, on another hardware file.
void predict_plan_check(PlanCheck& check, const Config& cfg, const Schedule& schedule, const Hardware& hw,
                        const std::string& hardware_file);

nlohmann::json plan_check_json(const PlanCheck& check);
// InputError naming `origin` and the key when the object is not a plan check.
PlanCheck parse_plan_check(const nlohmann::json& j, const std::string& origin);
// RUN_DIR/plan_check.json (InputError when it is missing, naming train.profile_steps).
PlanCheck read_plan_check(const std::string& run_dir);
// Writes RUN_DIR/plan_check.json whole (a temporary file renamed).
void write_plan_check(const std::string& run_dir, const PlanCheck& check);

// The table `tripod plan --check` prints: per family and for the step, predicted, measured, the
// family's share of the measured step and the error: relative for a family that takes at least
// kSmallShare of the measured step, else the difference as a share of the step (a relative error
// of a family near zero says nothing).
std::string plan_check_table(const PlanCheck& check);
inline constexpr double kSmallShare = 0.05;

}  // namespace tripod
