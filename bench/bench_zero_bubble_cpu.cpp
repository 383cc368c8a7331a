// Zero-bubble schedules measured against the simulator on the CPU: pp = 2 ranks, one BLAS thread
// each, m = 8 micro-batches, a GPT whose stage forward takes tens of ms. For 1f1b, interleaved
// (vp 2), zb-h1, zbv (V placement) and auto (chosen at start-up from a profile of this model) it
// trains a few steps with the trace on and prints, per schedule: the median step time, the
// pipeline's measured time per step (first compute start to last compute end over both ranks,
// from the traces), the simulator's makespan for the same schedule with the per-stage F, I, W
// and B times measured in that run, their difference, and each rank's idle fraction (1 - compute
// / pipeline time) measured and predicted.
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun -np 2 build/bin/bench_zero_bubble_cpu [steps]
#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "config/layout.h"
#include "core/log.h"
#include "kernels/op.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/pipeline/simulate.h"
#include "report/trace_merge.h"
#include "train/trainer.h"

using namespace tripod;

namespace {

struct Run {
  const char* label;
  ScheduleKind kind;
  int vp;
  Placement placement;
};

// Per virtual stage, the mean time (us) of each action kind in the steps used, from the traces.
StageCosts measured_costs(const MergedTrace& m, const Schedule& s, std::vector<double>& window_us) {
  const int S = s.num_stages();
  std::vector<double> sum(kActionKinds * S, 0), n(kActionKinds * S, 0);
  std::map<int64_t, std::pair<double, double>> window;
  for (const RankTrace& t : m.ranks)
    for (const TraceEvent& e : t.events) {
      if (e.cat != "forward" && e.cat != "backward") continue;
      auto [it, fresh] = window.try_emplace(e.step, e.ts, e.ts + e.dur);
      it->second.first = std::min(it->second.first, e.ts);
      it->second.second = std::max(it->second.second, e.ts + e.dur);
    }
  for (size_t r = 0; r < m.ranks.size(); ++r) {
    const int pp_rank = m.summary.ranks[r].coords.pp;
    for (const TraceEvent& e : m.ranks[r].events) {
      if (e.cat != "forward" && e.cat != "backward") continue;
      if (e.step == window.begin()->first) continue;  // the warm-up step
      auto a = parse_action(e.name);
      if (!a) continue;
      const int k = static_cast<int>(a->kind) * S + s.stage(pp_rank, a->chunk);
      sum[k] += e.dur;
      n[k] += 1;
    }
  }
  for (auto it = std::next(window.begin()); it != window.end(); ++it)
    window_us.push_back(it->second.second - it->second.first);
  auto mean = [&](ActionKind kind, int stage) {
    const int k = static_cast<int>(kind) * S + stage;
    return n[k] > 0 ? sum[k] / n[k] : 0.0;
  };
  StageCosts c;
  for (int st = 0; st < S; ++st) {
    const double f = mean(ActionKind::Forward, st), b = mean(ActionKind::Backward, st);
    const double i = mean(ActionKind::Input, st), w = mean(ActionKind::Weight, st);
    c.forward.push_back(f);
    c.backward.push_back(b > 0 ? b : i + w);
    c.weight.push_back(b > 0 ? b / 2 : w);
  }
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  init_logging(rank, size);
  spdlog::set_level(spdlog::level::warn);
  if (size != 2) {
    if (rank == 0) fmt::print(stderr, "error: run under mpirun -np 2 (got {} ranks)\n", size);
    MPI_Finalize();
    return 2;
  }
  const int steps = argc > 1 ? std::max(2, std::atoi(argv[1])) : 6;
  auto ops = make_ops(Device::CPU);
  Config cfg;
  cfg.model = {.n_layers = 8, .n_heads = 8, .d_model = 256, .ffn_hidden = 0, .seq_len = 128, .max_positions = 0,
               .vocab_size = 256};
  cfg.train.micro_batch_size = 2;
  cfg.train.global_batch_size = 16;  // m = 8 per pipeline
  cfg.train.steps = steps;
  cfg.train.log_interval = 1000000;
  cfg.data.synthetic = true;
  cfg.checkpoint.interval = 0;
  cfg.parallel.pp = 2;
  cfg.parallel.dp = 1;
  SyntheticSource data(cfg.model.seq_len, cfg.model.vocab_size, 1);
  MpiComm world(MPI_COMM_WORLD, "world", ops.get(), 600, {0, 1});
  ParallelContext par = make_parallel_context(world, RankGrid(1, 1, 2), {});

  // One run directory for both ranks, named by rank 0's process id.
  int id = rank == 0 ? static_cast<int>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const auto root = std::filesystem::temp_directory_path() / fmt::format("tripod_bench_zb_{}", id);

  if (rank == 0) {
    fmt::print("model: {} layers, d_model {}, seq {}, vocab {}; pp = 2, m = 8 micro-batches of {}; f32, one thread "
               "per rank; {} steps, the first left out\n",
               cfg.model.n_layers, cfg.model.d_model, cfg.model.seq_len, cfg.model.vocab_size,
               cfg.train.micro_batch_size, steps);
    fmt::print("{:<34} {:>9} {:>10} {:>10} {:>7} {:>17} {:>17}  {}\n", "schedule", "step ms", "pipe ms",
               "sim ms", "diff", "idle r0 meas/sim", "idle r1 meas/sim", "mean F/I/W/B ms (stage 0)");
  }
  const std::vector<Run> runs = {{"1f1b", ScheduleKind::OneFOneB, 1, Placement::Loop},
                                 {"interleaved (vp 2)", ScheduleKind::Interleaved, 2, Placement::Loop},
                                 {"zb-h1", ScheduleKind::ZbH1, 1, Placement::Loop},
                                 {"zbv", ScheduleKind::Zbv, 2, Placement::V},
                                 {"auto (v, vp 2)", ScheduleKind::Auto, 2, Placement::V}};
  for (const Run& run : runs) {
    Config c = cfg;
    c.parallel.schedule = run.kind;
    c.parallel.vp = run.vp;
    c.parallel.placement = run.placement;
    c.train.output_dir = (root / enum_name(run.kind)).string();
    validate_layout(c, 2);
    std::vector<double> times;
    Schedule schedule;
    std::string label = run.label;
    {
      Trainer t(c, *ops, par, &data);
      schedule = t.schedule();
      if (!t.auto_chosen().empty()) label += ": " + t.auto_chosen();
      for (int s = 0; s < steps; ++s) {
        const double dt = t.step().step_time_s;
        if (s > 0) times.push_back(dt);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      const MergedTrace m = merge_rank_traces(read_traces(c.train.output_dir));
      std::vector<double> window_us;
      const StageCosts costs = measured_costs(m, schedule, window_us);
      const Simulation sim = simulate(schedule, plan_pipeline(schedule), PipeCosts{}, costs);
      const double pipe = median(window_us) / 1e3, predicted = sim.makespan / 1e3;
      std::string idle[2];
      for (const TraceRankSummary& rs : m.summary.ranks)
        idle[rs.coords.pp] = fmt::format("{:.3f} / {:.3f}", rs.measured_idle, sim.ranks[rs.coords.pp].bubble);
      const double i0 = costs.backward[0] - costs.weight[0];
      fmt::print("{:<34} {:>9.1f} {:>10.1f} {:>10.1f} {:>6.1f}% {:>17} {:>17}  {:.1f}/{:.1f}/{:.1f}/{:.1f}\n",
                 label, 1e3 * median(times), pipe, predicted, 100 * (predicted - pipe) / pipe, idle[0], idle[1],
                 costs.forward[0] / 1e3, i0 / 1e3, costs.weight[0] / 1e3, costs.backward[0] / 1e3);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (rank == 0) std::filesystem::remove_all(root);
  MPI_Finalize();
  return 0;
}
