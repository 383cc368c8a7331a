// Training-step throughput on the CPU for GPT-2 shapes: tokens/s, model FLOP/s (DESIGN.md's
// 6N + 6LCT per token) and that rate as a fraction of the OpenBLAS sgemm rate measured in the
// same run with the same threads; with --profile, the time per op family (the backend's own
// timing, Ops::set_timing). Usage: bench_step_cpu [--quick] [--profile]
#include <fmt/format.h>
#include <mpi.h>

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "core/log.h"
#include "kernels/op.h"
#include "parallel/comm/mpi_comm.h"
#include "train/trainer.h"

using namespace tripod;

// The best rate of square sgemms over about a second: the machine is shared, and a short
// measurement undercounts whenever a neighbour is busy.
double sgemm_rate() {
  const int n = 2048;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  double best = 0;
  for (int rep = 0; rep < 12; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

struct BenchShape {
  const char* name;
  int layers, d_model, heads, seq, vocab, micro, micro_per_step, steps;
};

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  MPI_Init(&argc, &argv);
  init_logging(0, 1);
  spdlog::set_level(spdlog::level::warn);
  bool quick = false, profile = false;
  for (int i = 1; i < argc; ++i) {
    quick |= std::strcmp(argv[i], "--quick") == 0;
    profile |= std::strcmp(argv[i], "--profile") == 0;
  }
  auto ops = make_ops(Device::CPU);
  auto world = mpi_world(ops.get(), 600);
  ParallelContext par = make_parallel_context(*world, RankGrid(1, 1, 1), {});
  const double sgemm_before = sgemm_rate();

  std::vector<BenchShape> shapes = {{"tiny (4L, d128, seq128)", 4, 128, 4, 128, 512, 8, 2, 5},
                               {"gpt2 d768 12L seq256", 12, 768, 12, 256, 50257, 4, 2, quick ? 1 : 3}};
  struct Row {
    std::string name;
    double params, step_s, tokens_per_s, flops;
  };
  std::vector<Row> rows;
  std::vector<std::string> profiles;
  for (const BenchShape& s : shapes) {
    Config cfg;
    cfg.model = {.n_layers = s.layers, .n_heads = s.heads, .d_model = s.d_model, .ffn_hidden = 0, .seq_len = s.seq,
                 .max_positions = 0, .vocab_size = s.vocab};
    cfg.train.micro_batch_size = s.micro;
    cfg.train.global_batch_size = s.micro * s.micro_per_step;
    cfg.train.steps = s.steps + 1;
    cfg.train.output_dir = "";
    cfg.data.synthetic = true;
    validate_layout(cfg, 1);
    SyntheticSource data(s.seq, s.vocab, 1);
    Trainer t(cfg, *ops, par, &data);
    t.step();  // warm-up: first-touch of buffers, allocator cache
    ops->set_timing(profile);
    std::vector<double> times;
    for (int i = 0; i < s.steps; ++i) times.push_back(t.step().step_time_s);
    ops->set_timing(false);
    const OpTimes op_times = ops->take_times();
    // Shares are of the timed steps' total wall time (the median step can be shorter than their mean).
    const double timed_s = std::accumulate(times.begin(), times.end(), 0.0);
    std::sort(times.begin(), times.end());
    double median = times[times.size() / 2];
    double tokens = static_cast<double>(cfg.train.global_batch_size) * s.seq;
    double flops = cfg.model.flops_per_token() * tokens / median;
    rows.push_back({s.name, cfg.model.num_params() / 1e6, median, tokens / median, flops});
    if (profile) {
      std::string text;
      for (int f = 0; f < kNumOpFamilies; ++f) {
        if (op_times.calls[f] == 0) continue;
        const double v = op_times.seconds[f];
        text += fmt::format("    {:<12} {:6.1f}% of step ({:.3f} s/step, {} ops/step)\n",
                            op_family_name(static_cast<OpFamily>(f)), 100.0 * v / timed_s, v / s.steps,
                            op_times.calls[f] / s.steps);
      }
      profiles.push_back(text + fmt::format("    {:<12} {:6.1f}% of step\n", "outside ops",
                                            100.0 * (1 - op_times.total_seconds() / timed_s)));
    }
  }
  const double sgemm_after = sgemm_rate(), sgemm = std::max(sgemm_before, sgemm_after);
  fmt::print("sgemm rate (OpenBLAS, 2048^3, this process, best of 12 before and after the steps): {:.1f} GFLOP/s "
             "(before {:.1f}, after {:.1f})\n\n",
             sgemm / 1e9, sgemm_before / 1e9, sgemm_after / 1e9);
  fmt::print("{:<26} {:>10} {:>12} {:>14} {:>12} {:>10}\n", "shape", "params", "step (s)", "tokens/s", "GFLOP/s",
             "of sgemm");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    fmt::print("{:<26} {:>9.1f}M {:>12.3f} {:>14.0f} {:>12.1f} {:>9.1f}%\n", r.name, r.params, r.step_s,
               r.tokens_per_s, r.flops / 1e9, 100.0 * r.flops / sgemm);
    if (i < profiles.size()) fmt::print("{}", profiles[i]);
  }
  MPI_Finalize();
  return 0;
}
