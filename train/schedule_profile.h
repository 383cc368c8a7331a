// schedule = "auto" in training: the per-stage F, I and W times of this model on this machine,
// measured by a short profile at start-up, and the schedule auto_schedule builds from them.
#pragma once

#include "config/layout.h"
#include "model/gpt.h"
#include "parallel/context.h"
#include "parallel/pipeline/zero_bubble.h"

namespace tripod {

// Times the forward (F), the input gradient (I) and the weight gradients (W) of every local chunk
// of `model` on micro-batch `mb` (tokens where the rank holds the embedding, targets where it
// holds the head; other chunks take a constant input and output gradient): one untimed round,
// then `rounds` timed ones, keeping each action's fastest. Collective over the world (the TP
// groups run their collectives inside each action; one world all-reduce then gives every rank
// the mean over the tp*dp ranks holding each virtual stage). Leaves parameter gradients dirty:
// the caller zeroes them before training (Trainer::step does). Returns pp*vp entries per action.
StageCosts profile_stage_costs(GptModel& model, Ops& ops, const ParallelContext& par, const RankLayout& layout,
                               const MicroBatch& mb, int rounds = 2);

// The schedule auto_schedule builds for those costs with 1F1B's activation memory as the cap,
// and the candidate it chose; the same on every rank (the costs are).
AutoSchedule auto_training_schedule(const RankLayout& layout, const StageCosts& costs);

}  // namespace tripod
