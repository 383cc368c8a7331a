// What watching a run costs: the training loop's time per step (Trainer::run(), the step plus its
// logging) on the quick-start grid (configs/quickstart.toml: 8 ranks, dp = pp = tp = 2, vp 2,
// synthetic data, no evaluation or checkpoints) with TensorBoard event files off and on, and with
// the straggler monitor's all-gather off and on. The modes take turns, in a rotating order, over
// several rounds of one run; the table gives each mode's median and its ratio to "off". Below it,
// the direct costs timed alone: writing one logged step with and without TensorBoard, and one
// straggler all-gather, as fractions of a log interval.
//   mpirun -np 8 build/bin/bench_tensorboard [--rounds R] [--steps S] [--log-interval K]
#include <fmt/format.h>
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/log.h"
#include "data/sample_source.h"
#include "config/config.h"
#include "train/metrics.h"
#include "train/straggler.h"
#include "train/runtime.h"
#include "train/trainer.h"

using namespace tripod;

namespace {

struct Mode {
  const char* name;
  bool tensorboard;
  double straggler_factor;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void run_bench(int rank, int world, const std::string& dir, int rounds, int steps, int64_t log_interval) {
  Config base = load_config(std::string(TRIPOD_SOURCE_DIR) + "/configs/quickstart.toml",
                            {"data.synthetic=true", "train.eval_interval=0", "checkpoint.dir=\"\"", "checkpoint.interval=0",
                             "train.trace=false", "train.tensorboard_dir=\"\"", "train.straggler_factor=0",
                             fmt::format("train.log_interval={}", log_interval), fmt::format("train.steps={}", steps)});
  validate_layout(base, world);
  Runtime rt = make_runtime(base);
  SyntheticSource data(base.model.seq_len, base.model.vocab_size, 1);

  // The direct costs, timed alone (the loop's own noise hides them on a shared machine): one
  // logged step written by rank 0 without and with TensorBoard, and one straggler all-gather.
  const int reps = 200;
  double log_plain_us = 0, log_tb_us = 0;
  if (rank == 0) {
    StepRecord m;
    m.loss = 4.5, m.lr = 1e-3, m.grad_norm = 0.9, m.step_time_s = 0.4, m.tokens_per_s = 1e4, m.mfu = 0.3;
    m.batch_size = base.train.global_batch_size;
    auto& peaks = m.memory.emplace_back();
    for (const char* c : {"params", "grads", "optimizer", "activations", "workspace", "comm", "total"})
      peaks[c] = 123456789;
    for (bool tb : {false, true}) {
      MetricsLog log(fmt::format("{}/direct_{}", dir, tb), tb ? fmt::format("{}/direct_{}/tb", dir, tb) : "");
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 1; i <= reps; ++i) {
        m.step = i;
        m.consumed_samples = i * m.batch_size;
        log.log_step(m, reps);
      }
      (tb ? log_tb_us : log_plain_us) =
          1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    }
  }
  StragglerMonitor monitor(1.3, std::vector<int>(world, 0));
  MPI_Barrier(MPI_COMM_WORLD);
  auto g0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    monitor.add_step(0.4, 0.3);
    monitor.gather(*rt.par.world, i);
  }
  const double gather_us = 1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count() / reps;

  const std::vector<Mode> modes = {{"off", false, 0}, {"tensorboard", true, 0}, {"stragglers", false, 1.3},
                                   {"both", true, 1.3}};
  std::vector<std::vector<double>> per_step(modes.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < modes.size(); ++k) {
      const size_t i = (k + r) % modes.size();  // rotate: no mode always runs first
      Config cfg = base;
      cfg.train.output_dir = fmt::format("{}/{}_{}", dir, modes[i].name, r);
      if (modes[i].tensorboard) cfg.train.tensorboard_dir = cfg.train.output_dir + "/tb";
      cfg.train.straggler_factor = modes[i].straggler_factor;
      Trainer t(cfg, *rt.ops, rt.par, &data, nullptr, rt.debug);
      t.step();  // warm-up (first touch of buffers), outside the timing
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      t.run();
      MPI_Barrier(MPI_COMM_WORLD);
      per_step[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                            static_cast<double>(steps - 1));
    }
  }
  if (rank == 0) {
    fmt::print("quick-start grid (dp 2, pp 2, tp 2, vp 2, interleaved, sp, distributed optimizer), 8 CPU ranks, "
               "synthetic data; {} rounds x {} timed steps per mode, log interval {}\n",
               rounds, steps - 1, log_interval);
    fmt::print("{:<12} {:>16} {:>10}   {}\n", "mode", "median s/step", "vs off", "per round (s/step)");
    const double off = median(per_step[0]);
    for (size_t i = 0; i < modes.size(); ++i) {
      std::string rs;
      for (double v : per_step[i]) rs += fmt::format(" {:.4f}", v);
      fmt::print("{:<12} {:>16.4f} {:>10.4f}  {}\n", modes[i].name, median(per_step[i]), median(per_step[i]) / off, rs);
    }
    const double per_interval = off * static_cast<double>(log_interval);
    fmt::print("direct cost per logged step: metrics.jsonl {:.1f} us, metrics.jsonl + TensorBoard {:.1f} us "
               "(+{:.1f} us = {:.4f}% of a log interval of {} steps at the median 'off' step); straggler all-gather "
               "{:.1f} us ({:.4f}%)\n",
               log_plain_us, log_tb_us, log_tb_us - log_plain_us, 100 * (log_tb_us - log_plain_us) * 1e-6 / per_interval,
               log_interval, gather_us, 100 * gather_us * 1e-6 / per_interval);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  init_logging(rank, world);
  spdlog::set_level(spdlog::level::warn);
  int rounds = 5, steps = 20;
  int64_t log_interval = 10;  // the quick start's
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::max(2, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--log-interval") == 0) log_interval = std::max(1, std::atoi(argv[i + 1]));
  }
  if (world != 8) {
    if (rank == 0) fmt::print(stderr, "bench_tensorboard: run it on the quick-start grid: mpirun -np 8\n");
    MPI_Finalize();
    return 2;
  }
  // One scratch folder, named by rank 0.
  char dir_buf[512] = {};
  if (rank == 0) {
    const auto d = std::filesystem::temp_directory_path() / fmt::format("tripod_bench_tensorboard_{}", ::getpid());
    std::snprintf(dir_buf, sizeof dir_buf, "%s", d.string().c_str());
  }
  MPI_Bcast(dir_buf, sizeof dir_buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::string dir = dir_buf;

  run_bench(rank, world, dir, rounds, steps, log_interval);  // returns with its communicators freed
  MPI_Finalize();
  return 0;
}
