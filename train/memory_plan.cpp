// Per-rank memory estimates.
#include "train/memory_plan.h"

#include <fmt/format.h>

#include <map>

#include "model/memory_estimate.h"
#include "parallel/tensor_parallel/mappings.h"
#include "train/trainer.h"

namespace tripod {

RankMemory plan_rank_memory(const Config& cfg, int rank) {
  Schedule schedule = make_schedule(cfg);
  return plan_rank_memory(cfg, rank, schedule, plan_pipeline(schedule));
}

RankMemory plan_rank_memory(const Config& cfg, int rank, const Schedule& schedule, const PipePlan& plan) {
  const ParallelConfig& pc = cfg.parallel;
  const bool cuda = cfg.train.device == "cuda";
  const int64_t act_bytes = cuda ? 2 : 4;
  RankGrid grid(pc.tp, pc.dp, pc.pp);
  // The rank's model, registered but not allocated: the registry knows every shard's size.
  ParallelContext par;
  par.grid = grid;
  par.rank = rank;
  par.coords = grid.coords(rank);
  par.sequence_parallel = pc.sequence_parallel;
  auto cpu = make_ops(Device::CPU);
  ParamRegistry reg;
  auto chunks = rank_chunks(layers_per_stage(cfg.model.n_layers, pc.pp, pc.vp, pc.layers_per_stage), pc.pp, pc.vp,
                            par.coords.pp);
  GptModel model(*cpu, par, cfg.model, chunks, cfg.recompute, reg);

  RankMemory m;
  m.rank = rank;
  m.coords = par.coords;
  m.params = reg.flat_size() * act_bytes;
  m.grads = reg.flat_size() * 4;
  // Adam's two moments (and an f32 master copy when computing in bf16) over the owned ranges:
  // everything, or this DP rank's slice of each bucket.
  int64_t owned = 0;
  for (const GradBucket& b : make_grad_buckets(reg, model.wte(), pc.bucket_mb)) {
    if (!pc.distributed_optimizer || pc.dp == 1) {
      owned += b.span.size();
      continue;
    }
    int64_t per = (b.span.size() + pc.dp - 1) / pc.dp;
    owned += std::max<int64_t>(0, std::min(b.span.size(), (par.coords.dp + 1) * per) - par.coords.dp * per);
  }
  m.optimizer = owned * (cuda ? 12 : 8);

  ActivationShape shape{.B = cfg.train.micro_batch_size, .T = cfg.model.seq_len, .tp = pc.tp,
                        .sequence_parallel = pc.sequence_parallel, .act_bytes = act_bytes, .keeps_probs = !cuda};
  std::vector<ChunkActivationBytes> bytes;
  bool tokens = false, targets = false;
  for (const ChunkLayout& c : chunks) {
    bytes.push_back(chunk_activation_bytes(cfg.model, c, cfg.recompute, shape));
    tokens |= c.has_embedding;
    targets |= c.has_head;
  }
  const int64_t N = shape.B * shape.T;
  m.activations = activation_peak(schedule, plan, par.coords.pp, bytes, (tokens ? N * 4 : 0) + (targets ? N * 4 : 0));
  return m;
}

std::vector<RankMemory> plan_memory(const Config& cfg) {
  std::vector<RankMemory> out;
  RankGrid grid(cfg.parallel.tp, cfg.parallel.dp, cfg.parallel.pp);
  for (int r = 0; r < grid.world_size(); ++r) out.push_back(plan_rank_memory(cfg, r));
  return out;
}

std::string memory_table(const Config& cfg, const std::vector<RankMemory>& ranks) {
  auto gib = [](int64_t b) { return static_cast<double>(b) / (1 << 30); };
  std::map<std::pair<int, int>, RankMemory> rows;  // (pp, tp) -> the largest DP replica
  for (const RankMemory& m : ranks) {
    auto key = std::make_pair(m.coords.pp, m.coords.tp);
    if (!rows.count(key) || m.total() > rows[key].total()) rows[key] = m;
  }
  const char* modes[] = {"none", "selective", "full"};
  std::string out = fmt::format(
      "memory estimate per rank (GiB), recompute {}, schedule {}, micro-batch {} x {} tokens, {}:\n",
      modes[static_cast<int>(cfg.recompute.mode)],
      cfg.parallel.schedule_file.empty() ? cfg.parallel.schedule : cfg.parallel.schedule_file,
      cfg.train.micro_batch_size, cfg.model.seq_len, cfg.train.device == "cuda" ? "bf16" : "f32");
  out += fmt::format("{:>4} {:>4} {:>10} {:>10} {:>10} {:>12} {:>10}\n", "pp", "tp", "params", "grads", "optimizer",
                     "activations", "total");
  for (auto& [key, m] : rows)
    out += fmt::format("{:>4} {:>4} {:>10.3f} {:>10.3f} {:>10.3f} {:>12.3f} {:>10.3f}\n", key.first, key.second,
                       gib(m.params), gib(m.grads), gib(m.optimizer), gib(m.activations), gib(m.total()));
  return out;
}

}  // namespace tripod
