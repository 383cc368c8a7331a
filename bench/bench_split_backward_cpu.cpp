// The backward split for zero-bubble pipelines on the CPU: the times of B (the whole backward), of
// I (input gradients) and of W (weight gradients) of one model chunk, and the activation bytes
// held after the forward and between I and W (measured, and chunk_activation_bytes' figure), at
// GPT-2 small's width. Usage: bench_split_backward_cpu [--quick] (--quick: 2 layers, seq 128, an
// 8192-token vocabulary, 2 runs)
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/log.h"
#include "model/memory_estimate.h"
#include "train/runtime.h"

using namespace tripod;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  MPI_Init(&argc, &argv);
  init_logging(0, 1);
  spdlog::set_level(spdlog::level::warn);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  Config one_rank;  // (dp, pp, tp) = (1, 1, 1) on the CPU
  one_rank.parallel.dp = 1;
  Runtime rt = make_runtime(one_rank);
  Ops& ops = *rt.ops;

  const int layers = quick ? 2 : 6, reps = quick ? 2 : 5, vocab = quick ? 8192 : 50257;
  const int64_t B = 4, T = quick ? 128 : 256, N = B * T;
  fmt::print("GPT-2 / Llama width 768, {} layers, seq {}, micro-batch {}, vocabulary {}, CPU f32, one chunk with "
             "embedding and head; median of {} runs\n",
             layers, T, B, vocab, reps);
  fmt::print("{:<8} {:<10} {:>8} {:>8} {:>8} {:>8} {:>16} {:>16} {:>16}\n", "model", "recompute", "B (s)", "I (s)",
             "W (s)", "(I+W)/B", "after F (MiB)", "I..W (MiB)", "planned (MiB)");
  for (bool llama : {false, true})
    for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Full}) {
      ModelConfig cfg{.n_layers = layers, .n_heads = 12, .d_model = 768, .ffn_hidden = 0, .seq_len = static_cast<int>(T),
                      .max_positions = 0, .vocab_size = vocab};
      if (llama) {
        cfg.arch = Arch::Llama, cfg.norm = NormKind::RmsNorm, cfg.position = PositionKind::Rope, cfg.mlp = MlpKind::SwiGlu;
        cfg.n_kv_heads = 4, cfg.bias = false, cfg.tie_embeddings = false;
      }
      const RecomputeConfig rc{.mode = mode, .num_layers = -1};
      ParamRegistry reg;
      GptModel model(ops, rt.par, cfg, rank_chunks({layers}, 1, 1, 0), rc, reg);
      reg.allocate(ops);
      reg.initialize(ops, 1);
      MicroBatch mb;
      mb.shape = {B, T};
      mb.tokens = ops.empty({N}, DType::I32, MemCategory::Activations);
      mb.targets = ops.empty({N}, DType::I32, MemCategory::Activations);
      for (int64_t i = 0; i < N; ++i) {
        mb.tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % cfg.vocab_size);
        mb.targets.data<int32_t>()[i] = static_cast<int32_t>((i * 104729 + 1) % cfg.vocab_size);
      }
      mb.grad_scale = 1.f / N;
      mb.losses = ops.empty({N}, DType::F32, MemCategory::Workspace);
      MemoryStats& stats = ops.allocator().stats();
      const int64_t base = stats.current(MemCategory::Activations);
      std::vector<double> tb, ti, tw;
      int64_t after_f = 0, pending = 0;
      for (int r = 0; r < reps + 1; ++r) {  // the first run warms the allocator's cache
        ChunkActs acts;
        model.forward(0, mb, Tensor{}, acts);
        auto t0 = std::chrono::steady_clock::now();
        model.backward(0, mb, Tensor{}, acts);
        if (r > 0) tb.push_back(seconds_since(t0));
        model.forward(0, mb, Tensor{}, acts);
        after_f = stats.current(MemCategory::Activations) - base;
        ChunkPending p;
        t0 = std::chrono::steady_clock::now();
        model.backward_input(0, mb, Tensor{}, acts, p);
        if (r > 0) ti.push_back(seconds_since(t0));
        pending = stats.current(MemCategory::Activations) - base;
        t0 = std::chrono::steady_clock::now();
        model.backward_weight(0, p);
        if (r > 0) tw.push_back(seconds_since(t0));
      }
      const ActivationShape s{.B = B, .T = T, .act_bytes = 4, .keeps_probs = ops.keeps_attention_probs()};
      const int64_t planned = chunk_activation_bytes(cfg, model.layout(0), rc, s).weight_pending;
      const double b = median(tb), i = median(ti), w = median(tw);
      fmt::print("{:<8} {:<10} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.2f} {:>16.1f} {:>16.1f} {:>16.1f}\n",
                 llama ? "llama" : "gpt2", mode == RecomputeMode::None ? "none" : "full", b, i, w, (i + w) / b,
                 after_f / 1048576.0, pending / 1048576.0, planned / 1048576.0);
      std::fflush(stdout);
    }
  MPI_Finalize();
  return 0;
}
