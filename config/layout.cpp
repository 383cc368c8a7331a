// The rank layout: one pure function of the config and the rank.
#include "config/layout.h"

#include <fmt/format.h>

#include "kernels/op.h"
#include "model/param_registry.h"
#include "parallel/context.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/tensor_parallel/mappings.h"

namespace tripod {

int64_t RankLayout::owned_elements() const {
  int64_t n = 0;
  for (const FlatSpan& s : owned) n += s.size();
  return n;
}

int microbatches_per_rank(const Config& cfg) {
  return cfg.train.global_batch_size / (cfg.train.micro_batch_size * cfg.parallel.dp);
}

Schedule make_schedule(const Config& cfg) {
  const ParallelConfig& pc = cfg.parallel;
  const int micro = microbatches_per_rank(cfg);
  if (pc.schedule_file.empty()) return build_schedule(pc.schedule, pc.pp, pc.vp, micro, pc.placement);
  Schedule s = load_schedule_csv(pc.schedule_file);
  check_schedule_shape(s, pc.pp, pc.vp, micro, "parallel.schedule_file");
  TRIPOD_INPUT_CHECK(s.placement == pc.placement,
                     "parallel.schedule_file {} places its stages on the {} placement but parallel.placement = \"{}\"; "
                     "set parallel.placement = \"{}\"", pc.schedule_file, enum_name(s.placement),
                     enum_name(pc.placement), enum_name(s.placement));
  return s;
}

std::vector<int> stage_layers(const Config& cfg) {
  const ParallelConfig& pc = cfg.parallel;
  TRIPOD_CHECK(!pc.balance_layers || !pc.layers_per_stage.empty(),
               "parallel.layers_per_stage = \"auto\" was not resolved (balance_stages) before the layout was made");
  return layers_per_stage(cfg.model.n_layers, pc.pp, pc.vp, pc.layers_per_stage);
}

std::string split_str(const std::vector<int>& layers) {
  std::string out;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j < layers.size() && layers[j] == layers[i]) ++j;
    const size_t run = j - i;
    for (size_t k = 0; k < (run >= 3 ? 1 : run); ++k) {
      if (!out.empty()) out += '+';
      out += run >= 3 ? fmt::format("{}x{}", layers[i], run) : std::to_string(layers[i]);
    }
    i = j;
  }
  return out;
}

std::vector<ChunkLayout> chunks_of(const Config& cfg, int pp_rank) {
  const ParallelConfig& pc = cfg.parallel;
  return rank_chunks(stage_layers(cfg), pc.pp, pc.vp, pp_rank, pc.placement);
}

std::vector<GradBucket> make_grad_buckets(const ParamRegistry& reg, const Param* wte, double bucket_mb) {
  std::vector<FlatSpan> spans;
  std::vector<int> boundaries;  // no bucket holds parameters i and i+1
  const auto& ps = reg.params();
  for (int i = 0; i < static_cast<int>(ps.size()); ++i) {
    spans.push_back({ps[i].offset, ps[i].offset + ps[i].numel()});
    bool last = i + 1 == static_cast<int>(ps.size());
    if (!last && (&ps[i] == wte || &ps[i + 1] == wte || ps[i + 1].spec.chunk != ps[i].spec.chunk))
      boundaries.push_back(i);
  }
  return GradReducer::make_buckets(spans, static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4), boundaries);
}

RankLayout make_rank_layout(const Config& cfg, int rank) {
  Schedule schedule = make_schedule(cfg);
  PipePlan plan = plan_pipeline(schedule);
  return make_rank_layout(cfg, rank, schedule, plan);
}

RankLayout make_eval_layout(const Config& cfg, int rank) {
  Schedule schedule =
      forward_only_schedule(cfg.parallel.pp, cfg.parallel.vp, microbatches_per_rank(cfg), cfg.parallel.placement);
  PipePlan plan = plan_pipeline(schedule);
  return make_rank_layout(cfg, rank, schedule, plan);
}

RankLayout make_rank_layout(const Config& cfg, int rank, const Schedule& schedule, const PipePlan& plan) {
  const ParallelConfig& pc = cfg.parallel;
  RankLayout l;
  l.grid = RankGrid(pc.tp, pc.dp, pc.pp, pc.cp);
  l.rank = rank;
  l.coords = l.grid.coords(rank);
  l.sequence_parallel = pc.sequence_parallel;
  l.micro_batch_size = cfg.train.micro_batch_size;
  l.microbatches = microbatches_per_rank(cfg);
  l.micro_tokens = static_cast<int64_t>(l.micro_batch_size) * cfg.model.seq_len / pc.cp;
  l.schedule = schedule;
  l.plan = plan;
  l.stage_layers = stage_layers(cfg);
  l.chunks = rank_chunks(l.stage_layers, pc.pp, pc.vp, l.coords.pp, schedule.placement);
  for (const ChunkLayout& c : l.chunks) {
    l.has_embedding |= c.has_embedding;
    l.has_head |= c.has_head;
  }

  // The rank's parameters, registered without storage: the registry knows every shard's size.
  ParallelContext par;
  par.grid = l.grid;
  par.rank = rank;
  par.coords = l.coords;
  par.sequence_parallel = pc.sequence_parallel;
  l.local_tokens = local_tokens(par, l.micro_tokens);
  auto cpu = make_ops(Device::CPU);
  ParamRegistry reg;
  GptModel model(*cpu, par, cfg.model, l.chunks, cfg.recompute, reg);
  l.flat_elements = reg.flat_size();
  l.buffer_elements = reg.buffer_size();
  l.buckets = make_grad_buckets(reg, model.wte(), pc.bucket_mb);
  // Gradients are reduced over DP x CP; the distributed optimizer shards over that group too.
  const int reducers = pc.dp * pc.cp;
  const bool shard = pc.distributed_optimizer && reducers > 1;
  for (const GradBucket& b : l.buckets)
    l.owned.push_back(shard ? dp_shard(b.span, reducers, l.grid.dpcp_rank(l.coords)) : b.span);
  return l;
}

}  // namespace tripod
