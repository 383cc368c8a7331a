// A mixture of experts' training step against a dense model with the same active parameters, on
// one rank (CPU): a Llama-shaped model whose MLPs are 8 SwiGLU experts of width F/2 with top-2
// routing (softmax router, balancing and z-losses) against the same model with one dense MLP of
// width F. Both multiply each token by the same number of weights; the MoE step adds the router,
// the dispatch and combine copies, one GEMM per expert instead of one per layer, and the expert
// rows' host-side sizes. Prints the table (the target: the MoE step at most 1.5x the
// dense one) and, per model, the time per op family (Ops::set_timing).
// Usage: bench_moe_cpu [--quick]   (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS pick the threads)
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/log.h"
#include "kernels/op.h"
#include "parallel/comm/mpi_comm.h"
#include "train/trainer.h"

using namespace tripod;

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  MPI_Init(&argc, &argv);
  init_logging(0, 1);
  spdlog::set_level(spdlog::level::warn);
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick |= std::strcmp(argv[i], "--quick") == 0;
  auto ops = make_ops(Device::CPU);
  auto world = mpi_world(ops.get(), 600);
  ParallelContext par = make_parallel_context(*world, RankGrid(1, 1, 1), {});

  const int layers = 4, d = 512, heads = 8, seq = 512, vocab = 4096, micro = 4, F = 1536;
  const int steps = quick ? 3 : 8;
  struct Row {
    std::string name;
    double total, active, step_s, tokens_per_s;
    std::string profile;
  };
  std::vector<Row> rows;
  for (bool moe : {false, true}) {
    Config cfg;
    cfg.model = {.n_layers = layers, .n_heads = heads, .d_model = d, .ffn_hidden = F, .seq_len = seq,
                 .max_positions = 0, .vocab_size = vocab};
    cfg.model.arch = Arch::Llama;
    cfg.model.apply_arch_preset();
    cfg.model.n_kv_heads = 4;
    if (moe)
      cfg.model.moe = {.experts = 8, .top_k = 2, .ffn_hidden = F / 2, .aux_loss_coeff = 0.01, .z_loss_coeff = 0.001};
    cfg.train.micro_batch_size = micro;
    cfg.train.global_batch_size = micro * 2;
    cfg.train.steps = steps + 1;
    cfg.train.output_dir = "";
    cfg.train.trace = false;
    cfg.data.synthetic = true;
    validate_layout(cfg, 1);
    SyntheticSource data(seq, vocab, 1);
    Trainer t(cfg, *ops, par, &data);
    t.step();  // warm-up: first touch of the buffers, the allocator's cache
    ops->set_timing(true);
    std::vector<double> times;
    for (int i = 0; i < steps; ++i) times.push_back(t.step().step_time_s);
    ops->set_timing(false);
    const OpTimes op = ops->take_times();
    const double timed = std::accumulate(times.begin(), times.end(), 0.0);
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    std::string profile;
    for (int f = 0; f < kNumOpFamilies; ++f)
      if (op.calls[f] > 0)
        profile += fmt::format("    {:<12} {:5.1f}%\n", op_family_name(static_cast<OpFamily>(f)),
                               100.0 * op.seconds[f] / timed);
    rows.push_back({moe ? "8 experts, top 2 (F/2 each)" : "dense (F)", cfg.model.num_params() / 1e6,
                    cfg.model.num_params(1, /*active=*/true) / 1e6, median,
                    static_cast<double>(cfg.train.global_batch_size) * seq / median, profile});
  }
  fmt::print("{} layers, d_model {}, {} heads (4 key/value), seq {}, vocab {}, F = {}; {} sequences per step; median "
             "of {} steps\n\n",
             layers, d, heads, seq, vocab, F, micro * 2, steps);
  fmt::print("{:<30} {:>12} {:>12} {:>10} {:>12} {:>10}\n", "model", "params (M)", "active (M)", "step (s)",
             "tokens/s", "vs dense");
  for (const Row& r : rows)
    fmt::print("{:<30} {:>12.2f} {:>12.2f} {:>10.3f} {:>12.0f} {:>9.2f}x\n", r.name, r.total, r.active, r.step_s,
               r.tokens_per_s, r.step_s / rows[0].step_s);
  for (const Row& r : rows) fmt::print("\n{} (share of the timed steps):\n{}", r.name, r.profile);
  fmt::print("\ntarget: the MoE step at most 1.5x the dense step: {}\n",
             rows[1].step_s <= 1.5 * rows[0].step_s ? "met" : "NOT met");
  MPI_Finalize();
  return 0;
}
