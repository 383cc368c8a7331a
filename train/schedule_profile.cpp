// The start-up profile of schedule = "auto".
#include "train/schedule_profile.h"

#include <chrono>
#include <limits>

#include <spdlog/spdlog.h>

#include "checkpoint/reader.h"
#include "checkpoint/load.h"
#include "core/allocator.h"
#include "parallel/pipeline/schedules.h"
#include "train/microbatch.h"

namespace tripod {

StageCosts profile_stage_costs(GptModel& model, Ops& ops, const ParallelContext& par, const RankLayout& layout,
                               const MicroBatch& mb, int rounds) {
  const int S = layout.schedule.num_stages();
  const int64_t Ns = layout.local_tokens, C = model.config().d_model;
  using Clock = std::chrono::steady_clock;
  std::vector<double> f(model.num_chunks(), std::numeric_limits<double>::infinity()), i(f), w(f);
  MicroBatch in = mb;
  if (layout.has_head) {
    in.losses = ops.empty({layout.micro_tokens}, DType::F32, MemCategory::Workspace);
    ops.fill(in.losses, 0.f);
  }
  auto timed = [&](double& best, auto&& work) {
    ops.synchronize();
    const auto t0 = Clock::now();
    Tensor out = work();
    ops.synchronize();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    return out;
  };
  for (int round = 0; round <= rounds; ++round) {
    for (int c = 0; c < model.num_chunks(); ++c) {
      const ChunkLayout& cl = model.layout(c);
      double scratch = 0;
      // Round 0 warms up (allocator pools, caches); it is not kept.
      double& tf = round > 0 ? f[c] : scratch;
      double& ti = round > 0 ? i[c] : scratch;
      double& tw = round > 0 ? w[c] : scratch;
      Tensor x;
      if (!cl.has_embedding) {
        x = ops.empty({Ns, C}, ops.compute_dtype(), MemCategory::Activations);
        ops.fill(x, 0.5f);
      }
      ChunkActs acts;
      ChunkPending pending;
      timed(tf, [&] { return model.forward(c, in, x, acts); });
      Tensor dy;
      if (!cl.has_head) {
        dy = ops.empty({Ns, C}, ops.compute_dtype(), MemCategory::Workspace);
        ops.fill(dy, 1e-3f);
      }
      timed(ti, [&] { return model.backward_input(c, in, dy, acts, pending); });
      timed(tw, [&] {
        model.backward_weight(c, pending);
        return Tensor{};
      });
    }
  }
  // Every rank adds its stages' times; each stage is held by tp*dp ranks.
  CpuAllocator host;
  Tensor sums = Tensor::empty(host, {3 * S}, DType::F64, MemCategory::Workspace);
  double* v = sums.data<double>();
  std::fill(v, v + 3 * S, 0.0);
  for (int c = 0; c < model.num_chunks(); ++c) {
    const int s = model.layout(c).virtual_stage;
    v[s] = f[c], v[S + s] = i[c], v[2 * S + s] = w[c];
  }
  if (par.world && par.grid.world_size() > 1) par.world->all_reduce(sums);
  const double holders = static_cast<double>(par.grid.world_size()) / par.grid.pp();  // tp * cp * dp
  std::vector<double> F(S), I(S), W(S);
  for (int s = 0; s < S; ++s) F[s] = v[s] / holders, I[s] = v[S + s] / holders, W[s] = v[2 * S + s] / holders;
  return stage_costs_fiw(F, I, W, S);
}

Schedule training_schedule(const Config& cfg, Ops& ops, ParallelContext& par, GptModel& model, ParamRegistry& reg,
                           const SampleSource* data, std::string& chosen) {
  const ParallelConfig& pc = cfg.parallel;
  if (pc.schedule != ScheduleKind::Auto || !pc.schedule_file.empty()) return make_schedule(cfg);
  if (!cfg.checkpoint.load.empty()) {
    const std::string dir = resolve_checkpoint(cfg.checkpoint.load, cfg.checkpoint.dir);
    const nlohmann::json meta = CheckpointReader(dir).metadata();  // a copy: the reader is a temporary
    if (meta.contains("schedule_csv") && meta["schedule_csv"].is_string() &&
        !meta["schedule_csv"].get<std::string>().empty()) {
      Schedule s = parse_schedule_csv(meta["schedule_csv"].get<std::string>(), dir + "/metadata.json (schedule_csv)");
      if (s.pp == pc.pp && s.vp == pc.vp && s.microbatches == microbatches_per_rank(cfg) &&
          s.placement == pc.placement) {
        s.kind = ScheduleKind::Auto;
        chosen = "as in " + dir;
        return s;
      }
    }  // a checkpoint of another pipeline shape: profiled anew
  }
  const auto t0 = std::chrono::steady_clock::now();
  reg.allocate(ops);
  reg.initialize(ops, cfg.train.seed);
  const RankLayout probe = make_rank_layout(cfg, par.rank);  // the step's shape (unit-cost schedule)
  MicroBatch mb;
  load_microbatch(data, cfg, probe, ops, /*consumed=*/0, /*micro=*/0, mb);
  const StageCosts costs = profile_stage_costs(model, ops, par, probe, mb);
  AutoSchedule a;
  Schedule s = make_schedule(cfg, costs, &a);
  chosen = a.chosen;
  std::string times;
  for (size_t i = 0; i < costs.forward.size(); ++i)
    times += fmt::format("{}{:.2f}/{:.2f}/{:.2f}", i ? ", " : "", 1e3 * costs.forward[i],
                         1e3 * (costs.backward[i] - costs.weight[i]), 1e3 * costs.weight[i]);
  double best_fixed = 0, makespan = 0;
  for (const AutoCandidate& c : a.candidates) {
    if (c.name == a.chosen) makespan = c.makespan;
    const bool fixed = c.name.rfind("list", 0) != 0;
    if (fixed && c.fits && (best_fixed == 0 || c.makespan < best_fixed)) best_fixed = c.makespan;
  }
  spdlog::info("schedule auto: profiled F/I/W per stage (ms) [{}] in {:.2f} s; chose {} of {} candidates, simulated "
               "step {:.1f} ms (best fixed schedule {:.1f} ms)",
               times, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), chosen,
               a.candidates.size(), 1e3 * makespan, 1e3 * best_fixed);
  return s;
}

}  // namespace tripod
