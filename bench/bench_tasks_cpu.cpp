// Multiple-choice scoring speed (train/task_evaluator.h) on one rank: GPT-2 124M (configs/
// gpt2_124m.toml's shape on the CPU, random weights) scoring four-choice examples of HellaSwag's
// shape as tripod eval does on one CPU rank (each example's context once through the KV cache, its
// four continuations as rows from there) against the same requests one choice per forward through
// the pipeline. Requests
// are token ids drawn at HellaSwag's lengths with GPT-2's tokenizer (context 30..70 tokens, each
// ending 10..35), so tokenization is not timed; the log-likelihoods of both runs are compared.
// Usage: bench_tasks_cpu [--examples N] [--micro-batch-size B] [--layers L]
#include <fmt/format.h>
#include <mpi.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>

#include "core/log.h"
#include "kernels/op.h"
#include "train/runtime.h"
#include "train/task_evaluator.h"

using namespace tripod;

// This process's CPU seconds (every thread): on a shared machine the wall time includes the time
// slices other processes took, the CPU time does not.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  MPI_Init(&argc, &argv);
  init_logging(0, 1);
  spdlog::set_level(spdlog::level::warn);
  int examples = 200, micro_batch = 2, layers = 12;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--examples")) examples = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--micro-batch-size")) micro_batch = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--layers")) layers = std::stoi(argv[i + 1]);
  }
  Config cfg;
  cfg.model = {.n_layers = layers, .n_heads = 12, .d_model = 768, .ffn_hidden = 0, .seq_len = 1024,
               .max_positions = 0, .vocab_size = 50257};
  cfg.parallel.dp = 1;
  cfg.train.micro_batch_size = micro_batch;
  cfg.train.global_batch_size = micro_batch;
  cfg.train.output_dir = "";
  cfg.data.synthetic = true;
  validate_layout(cfg, 1);
  Runtime rt = make_runtime(cfg);
  Ops& ops = *rt.ops;
  const RankLayout layout = make_eval_layout(cfg, 0);
  ParamRegistry reg;
  GptModel model(ops, rt.par, cfg.model, layout.chunks, RecomputeConfig{}, reg);
  reg.allocate(ops);
  reg.initialize(ops, 1234);
  TaskEvaluator scorer(cfg, layout, ops, rt.par, model, reg);

  std::mt19937 rng(7);
  const auto uniform = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo + 1)); };
  std::vector<ScoreRequest> requests;
  int64_t tokens = 0;
  for (int e = 0; e < examples; ++e) {
    std::vector<int32_t> context(uniform(30, 70));
    for (int32_t& t : context) t = uniform(0, 50256);
    for (int c = 0; c < 4; ++c) {
      ScoreRequest r;
      r.tokens = context;
      const int n = uniform(10, 35);
      for (int k = 0; k < n; ++k) r.tokens.push_back(uniform(0, 50256));
      r.scored = n;
      r.example = e;
      r.part = c;
      tokens += r.length();
      requests.push_back(std::move(r));
    }
  }
  scorer.loglikelihoods(std::span(requests).first(8), "", 2);  // warm-up: first allocations, thread pools

  fmt::print("GPT-2 124M shape ({} layers, d_model 768, vocab 50257, seq 1024), CPU f32, one rank: {} four-choice "
             "examples, {} requests, {} tokens\n", layers, examples, requests.size(), tokens);
  fmt::print("{:<28} {:>16} {:>10} {:>12} {:>8} {:>12} {:>12}\n", "mode", "tokens computed", "seconds",
             "examples/s", "speedup", "CPU seconds", "CPU speedup");
  std::vector<double> lls[2];
  double seconds[2] = {0, 0}, cpu[2] = {0, 0};
  for (int batched = 1; batched >= 0; --batched) {
    // One at a time: every row padded to a multiple of 8; shared: each context once, then each
    // continuation's tokens.
    int64_t computed = 0;
    if (batched) {
      for (size_t i = 0; i < requests.size(); i += 4) {
        const int64_t P = requests[i].length() - requests[i].scored;
        computed += P;
        for (size_t r = i; r < i + 4; ++r) computed += requests[r].length() - P;
      }
    } else {
      for (const ScoreBatch& b : plan_score_batches(requests, {.max_tokens = cfg.model.seq_len, .seq_len = cfg.model.seq_len,
                                                              .granule = 1, .split = 1, .batch = false}))
        computed += b.B * b.T;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    lls[batched] = scorer.loglikelihoods(requests, "", examples, batched == 1);
    seconds[batched] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu[batched] = cpu_seconds() - c0;
    fmt::print("{:<28} {:>16} {:>10.2f} {:>12.2f} {:>8.2f} {:>12.2f} {:>12.2f}\n",
               batched ? "shared contexts (KV cache)" : "one choice at a time", computed, seconds[batched], examples / seconds[batched],
               seconds[0] > 0 ? seconds[0] / seconds[1] : 1.0, cpu[batched], cpu[0] > 0 ? cpu[0] / cpu[1] : 1.0);
    std::fflush(stdout);
  }
  double worst = 0;
  for (size_t i = 0; i < requests.size(); ++i)
    worst = std::max(worst, std::abs(lls[0][i] - lls[1][i]) / std::max(1.0, std::abs(lls[1][i])));
  fmt::print("speedup {:.2f}x (CPU time {:.2f}x); log-likelihoods shared vs one at a time: worst relative "
             "difference {:.1e}; load average at the end {}\n", seconds[0] / seconds[1], cpu[0] / cpu[1], worst,
             [] { double l[1] = {0}; return getloadavg(l, 1) == 1 ? fmt::format("{:.1f}", l[0]) : std::string("?"); }());
  MPI_Finalize();
  return 0;
}
