// Packed documents on the CPU: a small GPT (2 layers, d_model 128, 4 heads, vocab 512) at seq
// 8192, one sequence per step, documents of geometric lengths (mean 512) ending with the
// end-of-document token. Attention within documents (data.reset_attention_mask +
// reset_position_ids) against the full causal mask over the same tokens: per run the median step
// time, tokens/s and attention time per step (the op timer's attention family; the slowest rank's),
// cp = 1 on rank 0 and, under mpirun -np 2, cp = 2 on both ranks (ring and all-gather), with the
// bytes each rank's CP exchanges send per step. cp = 1's causal baseline keeps the attention
// probabilities (the CPU backend's default without recomputation); "causal, selective" recomputes
// them, as the document path and context parallelism always do. Run every rank on one thread:
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 mpirun -np 2 build/bin/bench_documents_cpu [--steps S] [--seq T] [--mean M]
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/log.h"
#include "core/rng.h"
#include "kernels/op.h"
#include "parallel/comm/mpi_comm.h"
#include "train/trainer.h"

using namespace tripod;

namespace {

// Documents of geometric lengths (mean `mean`) back to back, each ending with `eod`; sample i is
// stream tokens [i T, i T + T].
class GeometricDocuments final : public SampleSource {
 public:
  GeometricDocuments(int64_t T, double mean, int32_t eod, int64_t samples) : T_(T), n_(samples) {
    CounterRng rng(7, 11);
    int64_t draw = 0;
    while (static_cast<int64_t>(stream_.size()) < samples * T + 1) {
      // Geometric on {1, 2, ...} with mean `mean`: P(L = k) = p (1 - p)^(k - 1), p = 1 / mean.
      const double u = std::max(1e-12, rng.uniform(draw++));
      const auto len = static_cast<int64_t>(std::ceil(std::log(u) / std::log(1.0 - 1.0 / mean)));
      for (int64_t i = 0; i + 1 < std::max<int64_t>(len, 1); ++i)
        stream_.push_back(static_cast<int32_t>(rng.uniform(draw++) * eod) % eod);
      stream_.push_back(eod);
      lengths_.push_back(std::max<int64_t>(len, 1));
    }
  }
  int64_t sample_tokens() const override { return T_ + 1; }
  int64_t num_samples() const override { return n_; }
  void get(int64_t index, std::span<int32_t> out) const override {
    const int64_t at = (index % n_) * T_;
    std::copy(stream_.begin() + at, stream_.begin() + at + T_ + 1, out.begin());
  }
  double mean_length() const {
    double s = 0;
    for (int64_t l : lengths_) s += static_cast<double>(l);
    return s / static_cast<double>(lengths_.size());
  }

 private:
  int64_t T_, n_;
  std::vector<int32_t> stream_;
  std::vector<int64_t> lengths_;
};

struct Run {
  std::string name;
  int cp;
  CpComm comm = CpComm::Ring;
  bool documents = false;
  RecomputeMode recompute = RecomputeMode::None;
};

struct Result {
  double step_s = 0, attention_s = 0, tokens_per_s = 0, mfu = 0;
  int64_t cp_bytes = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  init_logging(rank, size);
  spdlog::set_level(spdlog::level::warn);
  int steps = 3;
  int64_t seq = 8192;
  double mean = 512;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--seq" && i + 1 < argc) seq = std::stoll(argv[++i]);
    else if (a == "--mean" && i + 1 < argc) mean = std::stod(argv[++i]);
    else {
      if (rank == 0) fmt::print(stderr, "error: unknown argument '{}' (--steps S, --seq T, --mean M)\n", a);
      MPI_Finalize();
      return 2;
    }
  }
  if (size > 2 || steps < 1 || seq % 4 != 0) {
    if (rank == 0) fmt::print(stderr, "error: run on 1 or 2 ranks, with --steps >= 1 and --seq a multiple of 4\n");
    MPI_Finalize();
    return 2;
  }
  auto ops = make_ops(Device::CPU);
  Config cfg;
  cfg.model = {.n_layers = 2, .n_heads = 4, .d_model = 128, .ffn_hidden = 0, .seq_len = static_cast<int>(seq),
               .max_positions = 0, .vocab_size = 512};
  cfg.train.micro_batch_size = 1;
  cfg.train.global_batch_size = 1;
  cfg.train.steps = steps + 1;
  cfg.train.output_dir = "";
  cfg.train.trace = false;
  cfg.train.straggler_factor = 0;
  cfg.data.eod_token_id = cfg.model.vocab_size - 1;
  GeometricDocuments data(seq, mean, static_cast<int32_t>(cfg.data.eod_token_id), steps + 1);

  std::vector<Run> runs = {{"causal", 1},
                           {"causal, selective", 1, CpComm::Ring, false, RecomputeMode::Selective},
                           {"documents", 1, CpComm::Ring, true}};
  if (size == 2)
    runs.insert(runs.end(), {{"causal", 2}, {"documents", 2, CpComm::Ring, true},
                             {"causal", 2, CpComm::AllGather}, {"documents", 2, CpComm::AllGather, true}});
  if (rank == 0) {
    std::vector<int32_t> sample(seq + 1);
    double pairs = 0, docs = 0;
    for (int64_t i = 0; i <= steps; ++i) {
      data.get(i, sample);
      Documents one{.T = seq};
      one.add_sequence(std::span<const int32_t>(sample.data(), seq), static_cast<int32_t>(cfg.data.eod_token_id));
      pairs += one.squared_lengths();
      docs += static_cast<double>(one.count(0));
    }
    fmt::print("model: {} layers, d_model {}, {} heads, vocab {}; seq {}, 1 sequence per step; documents of geometric "
               "length, mean {:.0f} (drawn: {:.1f}), {:.1f} per sequence; attention pairs within documents / causal "
               "square: {:.3f}; {} timed steps after 1, one thread per rank\n",
               cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads, cfg.model.vocab_size, seq, mean,
               data.mean_length(), docs / (steps + 1), pairs / (steps + 1) / (static_cast<double>(seq) * seq), steps);
    fmt::print("{:<22} {:>3} {:>10} {:>10} {:>12} {:>10} {:>12}\n", "run", "cp", "step (s)", "tokens/s",
               "attention s", "MFU", "CP MB sent");
  }
  std::vector<Result> results;
  for (const Run& run : runs) {
    RankGrid grid(1, 1, 1, run.cp);
    const bool member = rank < grid.world_size();
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, rank, &comm);
    Result res;
    if (member) {
      std::vector<int> ranks(grid.world_size());
      for (int i = 0; i < grid.world_size(); ++i) ranks[i] = i;
      MpiComm world(comm, "world", ops.get(), 600, ranks);
      ContextOptions options;
      options.cp_comm = run.comm;
      ParallelContext par = make_parallel_context(world, grid, options);
      Config c = cfg;
      c.parallel.cp = run.cp;
      c.parallel.cp_comm = run.comm;
      c.recompute.mode = run.recompute;
      c.data.reset_attention_mask = c.data.reset_position_ids = run.documents;
      validate_layout(c, grid.world_size());
      Trainer t(c, *ops, par, &data);
      t.step();  // warm-up
      std::vector<double> step_s, attention_s, tps, mfu;
      const int64_t sent0 = par.cp ? par.cp->bytes_sent() : 0;
      for (int s = 0; s < steps; ++s) {
        ops->set_timing(true);
        const StepRecord m = t.step();
        ops->set_timing(false);
        double att = ops->take_times().seconds_of(OpFamily::Attention);
        MPI_Allreduce(MPI_IN_PLACE, &att, 1, MPI_DOUBLE, MPI_MAX, comm);
        step_s.push_back(m.step_time_s);
        attention_s.push_back(att);
        tps.push_back(m.tokens_per_s);
        mfu.push_back(m.mfu);
      }
      res = {median(step_s), median(attention_s), median(tps), median(mfu),
             par.cp ? (par.cp->bytes_sent() - sent0) / steps : 0};
      MPI_Comm_free(&comm);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    results.push_back(res);
    if (rank == 0)
      fmt::print("{:<22} {:>3} {:>10.3f} {:>10.0f} {:>12.3f} {:>9.2f}% {:>12}\n", run.name, run.cp, res.step_s,
                 res.tokens_per_s, res.attention_s, 100 * res.mfu,
                 run.cp > 1 ? fmt::format("{:.1f}", res.cp_bytes / 1e6) : std::string("-"));
  }
  if (rank == 0) {
    auto ratio = [&](size_t doc, size_t causal) {
      fmt::print("  {} cp = {}{}: attention {:.3f} of causal (target <= 0.25), step {:.2f}x faster (target >= 1.5)\n",
                 runs[doc].name, runs[doc].cp, runs[doc].cp > 1 ? fmt::format(" {}", enum_name(runs[doc].comm)) : "",
                 results[doc].attention_s / results[causal].attention_s, results[causal].step_s / results[doc].step_s);
    };
    fmt::print("documents against the causal mask:\n");
    ratio(2, 0);
    fmt::print("  (against causal with selective recomputation: attention {:.3f}, step {:.2f}x)\n",
               results[2].attention_s / results[1].attention_s, results[1].step_s / results[2].step_s);
    if (size == 2) {
      ratio(4, 3);
      ratio(6, 5);
    }
  }
  MPI_Finalize();
  return 0;
}
