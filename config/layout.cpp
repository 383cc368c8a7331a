// The rank layout: one pure function of the config and the rank.
#include "config/layout.h"

#include <fmt/format.h>

#include "kernels/op.h"
#include "model/param_registry.h"
#include "parallel/context.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/tensor_parallel/mappings.h"

namespace tripod {

int microbatches_per_rank(const Config& cfg) {
  return cfg.train.global_batch_size / (cfg.train.micro_batch_size * cfg.parallel.dp);
}

Schedule make_schedule(const Config& cfg, const StageCosts& auto_costs, AutoSchedule* auto_info) {
  const ParallelConfig& pc = cfg.parallel;
  const int micro = microbatches_per_rank(cfg);
  if (pc.schedule_file.empty() && pc.schedule == ScheduleKind::Auto) {
    check_schedule_kind(pc.schedule, pc.pp, pc.vp, micro, pc.placement);
    AutoSchedule a = auto_schedule(pc.pp, pc.vp, pc.placement, micro, auto_costs, /*comm=*/0, /*cap=*/0);
    Schedule s = a.schedule;
    if (auto_info) *auto_info = std::move(a);
    return s;
  }
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

std::vector<GradBucket> make_grad_buckets(const ParamRegistry& reg, const Param* wte, double bucket_mb,
                                          const std::function<bool(const Param&)>& in_group) {
  std::vector<FlatSpan> spans;
  std::vector<int> boundaries;  // no bucket holds spans j and j+1
  const auto& ps = reg.params();
  const Param* prev = nullptr;  // the group's previous parameter
  bool gap = false;             // a parameter of another group since then
  for (const Param& p : ps) {
    if (in_group && !in_group(p)) {
      gap = true;
      continue;
    }
    if (prev && (gap || prev == wte || &p == wte || p.spec.chunk != prev->spec.chunk))
      boundaries.push_back(static_cast<int>(spans.size()) - 1);
    spans.push_back({p.offset, p.offset + p.numel()});
    prev = &p;
    gap = false;
  }
  return make_buckets(spans, static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4), boundaries);
}

RankLayout make_rank_layout(const Config& cfg, int rank) { return make_rank_layout(cfg, rank, make_schedule(cfg)); }

RankLayout make_rank_layout(const Config& cfg, int rank, const Schedule& schedule) {
  return make_rank_layout(cfg, rank, schedule, plan_pipeline(schedule));
}

RankLayout make_eval_layout(const RankLayout& train) {
  RankLayout l = train;
  l.schedule = forward_only_schedule(train.schedule.pp, train.schedule.vp, train.microbatches, train.schedule.placement);
  l.plan = plan_pipeline(l.schedule);
  return l;
}

RankLayout make_eval_layout(const Config& cfg, int rank) {
  const ParallelConfig& pc = cfg.parallel;
  const Schedule s = forward_only_schedule(pc.pp, pc.vp, microbatches_per_rank(cfg), pc.placement);
  return make_rank_layout(cfg, rank, s, plan_pipeline(s));
}

namespace {

// The rank's gradient synchronisation (grad_sync.h): every gradient reduces over DP x CP (every
// rank of it holds the same parameters), sharded there under the distributed optimizer, except,
// with expert parallelism, the routed experts' over EDP (the ranks holding the same experts); the
// tied table's copies meet first where the loop placement puts the pipeline's ends on two ranks.
GradSync make_grad_sync(const Config& cfg, const RankLayout& l, const ParamRegistry& reg, const Param* wte) {
  const ParallelConfig& pc = cfg.parallel;
  GradSync g;
  if (l.grid.ep() > 1) g.expert_group = 1;
  auto add_group = [&](Axis axis, int rank, bool experts) {
    ReduceGroup& r = g.groups.emplace_back();
    r.axis = axis;
    r.size = l.grid.size(axis);
    r.rank = rank;
    r.sharded = pc.distributed_optimizer && r.size > 1;
    r.bucket_bytes = static_cast<int64_t>(pc.bucket_mb * 1024 * 1024);
    r.buckets = make_grad_buckets(reg, wte, pc.bucket_mb, [&](const Param& p) {
      return g.group_of(p.spec.expert >= 0) == (experts ? g.expert_group : 0);
    });
    for (const GradBucket& b : r.buckets) r.owned.push_back(r.sharded ? dp_shard(b.span, r.size, r.rank) : b.span);
  };
  add_group(Axis::DPCP, l.grid.dpcp_rank(l.coords), false);
  if (g.expert_group >= 0) add_group(Axis::EDP, l.grid.edp_rank(l.coords), true);
  // One chunk holding both ends (pp = 1) uses the table as any parameter.
  if (wte && !(l.chunks.size() == 1 && l.has_embedding && l.has_head)) {
    g.tied_table = {wte->offset, wte->offset + wte->numel()};
    g.tied = l.has_embedding && l.has_head ? GradSync::Tied::Local : GradSync::Tied::PipelineEnds;
  }
  return g;
}

}  // namespace

RankLayout make_rank_layout(const Config& cfg, int rank, const Schedule& schedule, const PipePlan& plan) {
  const ParallelConfig& pc = cfg.parallel;
  RankLayout l;
  l.grid = pc.grid();
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
  l.grad_sync = make_grad_sync(cfg, l, reg, model.wte());
  return l;
}

}  // namespace tripod
