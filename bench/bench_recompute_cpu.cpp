// Activation recomputation on the CPU: step time and peak activation memory for none, selective
// and full at GPT-2 small's width, with the ratios to "none" and the analytic plan beside the
// measured peak. Usage: bench_recompute_cpu [--quick]
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "train/runtime.h"
#include "config/memory_plan.h"
#include "train/trainer.h"
#include "kernels/op.h"

using namespace tripod;

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  MPI_Init(&argc, &argv);
  init_logging(0, 1);
  spdlog::set_level(spdlog::level::warn);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  Config one_rank;  // (dp, pp, tp) = (1, 1, 1) on the CPU
  one_rank.parallel.dp = 1;
  Runtime rt = make_runtime(one_rank);
  Ops* ops = rt.ops.get();
  ParallelContext& par = rt.par;

  Config cfg;
  cfg.model = {.n_layers = quick ? 4 : 12, .n_heads = 12, .d_model = 768, .ffn_hidden = 0, .seq_len = 256,
               .max_positions = 0, .vocab_size = 50257};
  cfg.train.micro_batch_size = 4;
  cfg.train.global_batch_size = 4;
  cfg.train.output_dir = "";
  cfg.data.synthetic = true;
  validate_layout(cfg, 1);
  SyntheticSource data(cfg.model.seq_len, cfg.model.vocab_size, 1);
  const int steps = quick ? 1 : 3;

  fmt::print("GPT-2 d_model 768, {} layers, seq 256, micro-batch 4, CPU f32; median of {} steps\n",
             cfg.model.n_layers, steps);
  fmt::print("{:<10} {:>10} {:>10} {:>18} {:>18} {:>10}\n", "recompute", "step (s)", "time x", "activations (MiB)",
             "planned (MiB)", "memory x");
  double base_time = 0, base_mem = 0;
  for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full}) {
    Config c = cfg;
    c.recompute.mode = mode;
    c.train.steps = steps + 1;
    Trainer t(c, *ops, par, &data);
    t.step();
    std::vector<double> times;
    int64_t peak = 0;
    for (int i = 0; i < steps; ++i) {
      StepRecord m = t.step();
      times.push_back(m.step_time_s);
      peak = std::max<int64_t>(peak, m.memory.at(0).at("activations"));
    }
    std::sort(times.begin(), times.end());
    double time = times[times.size() / 2];
    if (mode == RecomputeMode::None) base_time = time, base_mem = static_cast<double>(peak);
    const char* name = mode == RecomputeMode::None ? "none" : mode == RecomputeMode::Selective ? "selective" : "full";
    fmt::print("{:<10} {:>10.3f} {:>10.2f} {:>18.1f} {:>18.1f} {:>10.2f}\n", name, time, time / base_time,
               peak / 1048576.0, plan_rank_memory(c, 0).activations / 1048576.0, peak / base_mem);
  }
  MPI_Finalize();
  return 0;
}
