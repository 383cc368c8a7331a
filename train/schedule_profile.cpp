// The start-up profile of schedule = "auto".
#include "train/schedule_profile.h"

#include <chrono>
#include <limits>

#include "core/allocator.h"

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
  const double holders = static_cast<double>(par.grid.tp()) * par.grid.dp();
  std::vector<double> F(S), I(S), W(S);
  for (int s = 0; s < S; ++s) F[s] = v[s] / holders, I[s] = v[S + s] / holders, W[s] = v[2 * S + s] / holders;
  return stage_costs_fiw(F, I, W, S);
}

AutoSchedule auto_training_schedule(const RankLayout& layout, const StageCosts& costs) {
  const Schedule& s = layout.schedule;
  return auto_schedule(s.pp, s.vp, s.placement, s.microbatches, costs, /*comm=*/0, /*cap=*/0);
}

}  // namespace tripod
