// schedule = "auto" in training: the per-stage F, I and W times of this model on this machine,
// measured by a short profile at start-up, and the schedule auto_schedule builds from them.
#pragma once

#include "config/layout.h"
#include "data/sample_source.h"
#include "model/gpt.h"
#include "parallel/context.h"
#include "parallel/pipeline/zero_bubble.h"

namespace tripod {

// Times the forward (F), the input gradient (I) and the weight gradients (W) of every local chunk
// of `model` on micro-batch `mb` (tokens where the rank holds the embedding, targets where it
// holds the head; other chunks take a constant input and output gradient): one untimed round,
// then `rounds` timed ones, keeping each action's fastest. Collective over the world (the TP
// groups run their collectives inside each action; one world all-reduce then gives every rank
// the mean over the tp*cp*dp ranks holding each virtual stage). Leaves parameter gradients dirty:
// the caller zeroes them before training (Trainer::step does). Returns pp*vp entries per action.
StageCosts profile_stage_costs(GptModel& model, Ops& ops, const ParallelContext& par, const RankLayout& layout,
                               const MicroBatch& mb, int rounds = 2);

// A training run's schedule, resolved before its layout is made: make_schedule(cfg), except for
// parallel.schedule = "auto" (without a schedule_file): the schedule a resumed run's checkpoint
// recorded when the pipeline's shape (pp, vp, placement, micro-batches) is the same (bit-exact
// continuation), else make_schedule for this model's F, I and W per virtual stage as
// profile_stage_costs measures them on `model` (its registry `reg` allocated and initialised from
// train.seed here) on the first micro-batch of `data`. The same on every rank (collective under
// "auto"); `chosen` names the candidate for the log ("" for a fixed schedule).
Schedule training_schedule(const Config& cfg, Ops& ops, ParallelContext& par, GptModel& model, ParamRegistry& reg,
                           const SampleSource* data, std::string& chosen);

}  // namespace tripod
