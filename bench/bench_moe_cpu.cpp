// A mixture of experts' training step on the CPU, two tables.
//
// One rank: against a dense model with the same active parameters: a Llama-shaped model whose
// MLPs are 8 SwiGLU experts of width F/2 with top-2 routing (softmax router, balancing and
// z-losses) against the same model with one dense MLP of width F. Both multiply each token by the
// same number of weights; the MoE step adds the router, the dispatch and combine copies, one GEMM
// per expert instead of one per layer, and the expert rows' host-side sizes. Prints the table
// (the target: the MoE step at most 1.5x the dense one) and, per model, the time per op
// family (Ops::set_timing).
//
// Two ranks (mpirun -np 2): expert parallelism. The same MoE model on dp = 2 at ep = 1 (every
// expert on both ranks) against ep = 2 (4 experts each) with the all-to-all and the all-gather
// dispatcher, each without and with the distributed optimizer: tokens/s, peak memory per rank,
// the expert parameters' and their Adam state's bytes per rank (the target: ep = 2 at
// most 60% of ep = 1's), and the dispatcher's share of the step (TokenDispatcher::seconds: the
// counts' exchange, permutes, all-to-alls / all-gathers and their waits).
// Usage: [mpirun -np 2] bench_moe_cpu [--quick]   (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS pick the threads)
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/log.h"
#include "kernels/op.h"
#include "model/moe.h"
#include "parallel/comm/mpi_comm.h"
#include "train/trainer.h"

using namespace tripod;

namespace {

constexpr int layers = 4, d = 512, heads = 8, seq = 512, vocab = 4096, micro = 4, kF = 1536;

// The benchmark's model: dense (one MLP of width F) or 8 experts of F/2, top 2.
Config model_config(bool moe, int steps) {
  Config cfg;
  cfg.model = {.n_layers = layers, .n_heads = heads, .d_model = d, .ffn_hidden = kF, .seq_len = seq,
               .max_positions = 0, .vocab_size = vocab};
  cfg.model.arch = Arch::Llama;
  cfg.model.apply_arch_preset();
  cfg.model.n_kv_heads = 4;
  if (moe)
    cfg.model.moe = {.experts = 8, .top_k = 2, .ffn_hidden = kF / 2, .aux_loss_coeff = 0.01, .z_loss_coeff = 0.001};
  cfg.train.micro_batch_size = micro;
  cfg.train.global_batch_size = micro * 2;
  cfg.train.steps = steps + 1;
  cfg.train.output_dir = "";
  cfg.train.trace = false;
  cfg.data.synthetic = true;
  return cfg;
}

// ep = 1 against ep = 2 on the two ranks of `world` (dp = 2).
int expert_parallel(Ops& ops, MpiComm& world, int steps) {
  struct Row {
    std::string name;
    double step_s = 0, tokens_per_s = 0, dispatch_share = 0;
    int64_t peak = 0, expert_params = 0, expert_optimizer = 0;
  };
  std::vector<Row> rows;
  for (int ep : {1, 2})
    for (MoeDispatcher dispatcher : {MoeDispatcher::AllToAll, MoeDispatcher::AllGather})
      for (bool distopt : {false, true}) {
        if (ep == 1 && dispatcher == MoeDispatcher::AllGather) continue;  // no dispatcher to choose
        Config cfg = model_config(/*moe=*/true, steps);
        cfg.parallel.dp = 2;
        cfg.parallel.ep = ep;
        cfg.parallel.moe_dispatcher = dispatcher;
        cfg.parallel.distributed_optimizer = distopt;
        validate_layout(cfg, 2);
        ParallelContext par =
            make_parallel_context(world, cfg.parallel.grid(), {.moe_dispatcher = cfg.parallel.moe_dispatcher});
        SyntheticSource data(seq, vocab, 1);
        Trainer t(cfg, ops, par, &data);
        t.step();  // warm-up
        auto dispatcher_s = [&] {
          double s = 0;
          for (MoeLayer* l : t.model().moe_layers()) s += l->dispatcher_seconds();
          return s;
        };
        const double d0 = dispatcher_s();
        std::vector<double> times;
        int64_t peak = 0;
        for (int i = 0; i < steps; ++i) {
          const StepRecord m = t.step();
          times.push_back(m.step_time_s);
          peak = std::max<int64_t>(peak, m.memory.at(0).at("total"));
        }
        const double timed = std::accumulate(times.begin(), times.end(), 0.0);
        std::sort(times.begin(), times.end());
        Row r;
        r.name = ep == 1 ? fmt::format("ep=1{}", distopt ? " +distopt" : "")
                         : fmt::format("ep=2 {}{}", enum_name(dispatcher), distopt ? " +distopt" : "");
        r.step_s = times[times.size() / 2];
        r.tokens_per_s = static_cast<double>(cfg.train.global_batch_size) * seq / r.step_s;
        r.dispatch_share = (dispatcher_s() - d0) / timed;
        r.peak = peak;
        // The routed experts' values (f32 on the CPU) and Adam's m and v for the elements this
        // rank's optimizer updates.
        for (const Param& p : t.registry().params()) {
          if (p.spec.expert < 0) continue;
          r.expert_params += p.numel() * 4;
          for (const OptimizerShardRef& o : t.optimizer_state()) {
            const int64_t b = std::max(o.span.begin, p.offset), e = std::min(o.span.end, p.offset + p.numel());
            if (b < e) r.expert_optimizer += (e - b) * (o.master.defined() ? 12 : 8);
          }
        }
        rows.push_back(r);
      }
  if (world.rank() == 0) {
    fmt::print("expert parallelism on 2 ranks (dp = 2), rank 0's figures: {} layers, d_model {}, seq {}, 8 experts "
               "of width {}, top 2; {} sequences per step; median of {} steps\n\n",
               layers, d, seq, kF / 2, micro * 2, steps);
    fmt::print("{:<26} {:>9} {:>10} {:>11} {:>13} {:>13} {:>9} {:>11}\n", "layout", "step (s)", "tokens/s",
               "peak (MB)", "experts (MB)", "expert Adam", "vs ep=1", "dispatcher");
    for (const Row& r : rows) {
      const Row& base = rows[r.name.find("+distopt") != std::string::npos ? 1 : 0];
      fmt::print("{:<26} {:>9.3f} {:>10.0f} {:>11.1f} {:>13.1f} {:>13.1f} {:>8.0f}% {:>10.1f}%\n", r.name, r.step_s,
                 r.tokens_per_s, r.peak / 1e6, r.expert_params / 1e6, r.expert_optimizer / 1e6,
                 100.0 * (r.expert_params + r.expert_optimizer) / (base.expert_params + base.expert_optimizer),
                 100 * r.dispatch_share);
    }
    fmt::print("\n(experts: the routed experts' values; expert Adam: their m and v this rank updates; vs ep=1: "
               "both together against ep = 1 with the same optimizer; dispatcher: its share of the timed steps)\n");
    bool met = true;
    for (const Row& r : rows)
      if (r.name.rfind("ep=2", 0) == 0 && r.name.find("+distopt") == std::string::npos)
        met &= r.expert_params + r.expert_optimizer <= 0.6 * (rows[0].expert_params + rows[0].expert_optimizer);
    fmt::print("target: ep = 2 at most 60% of ep = 1's expert parameter and optimizer bytes per rank: {}\n",
               met ? "met" : "NOT met");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  MPI_Init(&argc, &argv);
  init_logging(0, 1);
  spdlog::set_level(spdlog::level::warn);
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick |= std::strcmp(argv[i], "--quick") == 0;
  auto ops = make_ops(Device::CPU);
  auto world = mpi_world(ops.get(), 600);
  const int steps = quick ? 3 : 8;
  if (world->size() == 2) {
    const int rc = expert_parallel(*ops, *world, steps);
    MPI_Finalize();
    return rc;
  }
  ParallelContext par = make_parallel_context(*world, RankGrid(1, 1, 1), {});

  struct Row {
    std::string name;
    double total, active, step_s, tokens_per_s;
    std::string profile;
  };
  std::vector<Row> rows;
  for (bool moe : {false, true}) {
    Config cfg = model_config(moe, steps);
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
             layers, d, heads, seq, vocab, kF, micro * 2, steps);
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
