// Communication volume and step time of tensor and data parallelism on the CPU. Run under
// mpirun with 2 ranks: for each layout it trains a few steps of the same model and global batch
// and prints, per rank and step, the bytes each axis sent beside the analytic expectation, and
// the median step time.
//   mpirun -np 2 build/bin/bench_parallel_cpu
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>

#include "core/log.h"
#include "parallel/comm/mpi_comm.h"
#include "config/layout.h"
#include "train/trainer.h"
#include "kernels/op.h"

using namespace tripod;

namespace {

struct Layout {
  int tp, dp;
  bool sp, distopt;
};

// Bytes one rank sends per step, by the ring formulas the communicator counts with.
struct Expect {
  double tp = 0, dp = 0;
};

Expect expected(const Config& c, const Layout& l, const RankLayout& rl) {
  const double b = 4;  // f32 activations on the CPU
  const int64_t L = c.model.n_layers, C = c.model.d_model;
  const int64_t N = rl.micro_tokens, micro = rl.microbatches;
  const int64_t grad_elems = rl.flat_elements, param_elems = rl.flat_elements;
  Expect e;
  if (l.tp > 1) {
    const double p = l.tp, act = N * C * b;
    const double ar = 2 * (p - 1) / p * act, half = (p - 1) / p * act;  // all-reduce; gather or scatter
    // Per micro-batch. Without SP: 2 all-reduces per block forward (after the row-parallel
    // linears) and 2 backward (before the column-parallel ones), the embedding's all-reduce and
    // the head's backward all-reduce. With SP a block's forward gathers twice and scatters
    // twice, its backward gathers twice, re-gathers the two saved LayerNorm outputs and scatters
    // twice (10 halves); the embedding scatters and gathers (2), the head gathers, re-gathers and
    // scatters (3). Both gather the cross-entropy statistics (N x 3 f32).
    double per_micro = l.sp ? (10 * L + 5) * half : (4 * L + 2) * ar;
    per_micro += (p - 1) * N * 3 * 4.0;
    e.tp = per_micro * micro;
    if (l.sp) e.tp += 2 * (p - 1) / p * (4 * L + 2) * C * 4.0;  // LayerNorm grads summed over TP
  }
  if (l.dp > 1) {
    const double p = l.dp;
    e.dp = l.distopt ? (p - 1) / p * (grad_elems * 4.0 + param_elems * b) : 2 * (p - 1) / p * grad_elems * 4.0;
  }
  return e;
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
  auto ops = make_ops(Device::CPU);
  if (size != 2) {
    if (rank == 0) fmt::print(stderr, "error: run under mpirun -np 2 (got {} ranks)\n", size);
    MPI_Finalize();
    return 2;
  }
  Config cfg;
  cfg.model = {.n_layers = 4, .n_heads = 8, .d_model = 256, .ffn_hidden = 0, .seq_len = 128, .max_positions = 0,
               .vocab_size = 4096};
  cfg.train.micro_batch_size = 4;
  cfg.train.global_batch_size = 16;
  cfg.train.steps = 6;
  cfg.train.output_dir = "";
  cfg.data.synthetic = true;
  SyntheticSource data(cfg.model.seq_len, cfg.model.vocab_size, 1);

  if (rank == 0) {
    fmt::print("model: {} layers, d_model {}, seq {}, vocab {}; global batch {} x {} tokens; f32\n", cfg.model.n_layers,
               cfg.model.d_model, cfg.model.seq_len, cfg.model.vocab_size, cfg.train.global_batch_size,
               cfg.model.seq_len);
    fmt::print("{:<22} {:>10} {:>16} {:>16} {:>16} {:>16}\n", "layout", "step (s)", "TP sent MB", "TP expected MB",
               "DP sent MB", "DP expected MB");
  }
  for (Layout l : std::vector<Layout>{{1, 1, false, false}, {2, 1, false, false}, {2, 1, true, false},
                                      {1, 2, false, false}, {1, 2, false, true}}) {
    RankGrid grid(l.tp, l.dp, 1);
    bool member = rank < grid.world_size();
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, rank, &comm);
    if (member) {
      std::vector<int> ranks(grid.world_size());
      for (int i = 0; i < grid.world_size(); ++i) ranks[i] = i;
      MpiComm world(comm, "world", ops.get(), 600, ranks);
      ContextOptions options;
      options.sequence_parallel = l.sp;
      ParallelContext par = make_parallel_context(world, grid, options);
      Config c = cfg;
      c.parallel.tp = l.tp;
      c.parallel.dp = l.dp;
      c.parallel.sequence_parallel = l.sp;
      c.parallel.distributed_optimizer = l.distopt;
      validate_layout(c, grid.world_size());
      Trainer t(c, *ops, par, &data);
      t.step();  // warm-up
      int64_t tp0 = par.tp->bytes_sent(), dp0 = par.dp->bytes_sent();
      std::vector<double> times;
      const int steps = 5;
      for (int s = 0; s < steps; ++s) times.push_back(t.step().step_time_s);
      std::sort(times.begin(), times.end());
      double tp_mb = (par.tp->bytes_sent() - tp0) / 1e6 / steps, dp_mb = (par.dp->bytes_sent() - dp0) / 1e6 / steps;
      Expect e = expected(c, l, t.layout());
      if (rank == 0)
        fmt::print("{:<22} {:>10.3f} {:>16.2f} {:>16.2f} {:>16.2f} {:>16.2f}\n",
                   fmt::format("tp={} dp={}{}{}", l.tp, l.dp, l.sp ? " sp" : "", l.distopt ? " distopt" : ""),
                   times[times.size() / 2], tp_mb, e.tp / 1e6, dp_mb, e.dp / 1e6);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return 0;
}
