// GPU training throughput: GPT-2 124M and 350M, and a Llama-3.2-1B-shaped model (16 layers,
// d_model 2048, 32 query heads over 8 key/value heads, SwiGLU 8192, RMSNorm, rope, vocabulary
// 128256, tied embeddings: configs/llama3_2_1b.toml's model), at seq 1024 (--seq) on one GPU, through the real trainer
// step (forward, backward, grad norm, AdamW), with the largest micro-batch that fits. Prints one
// table row per model: tokens/s, MFU (DESIGN.md: 6N + 6LCT FLOPs per token over this GPU's dense
// bf16 peak, 989 TFLOP/s for H100 SXM), peak memory, and the share of the step's wall time spent
// in GEMMs, attention and the other ops (GPU time from cudaEvent pairs around each op, in separate
// steps) and the rest, the host gap (the GPU idle, waiting for the host).
//
//   tripod_gpu_bench [--model 124M|350M|1B|all] [--micro-batch B] [--steps N] [--warmup N]
//                    [--seq T] [--precision bf16|fp8|both] [--fp8-recipe tensorwise|delayed]
//                    [--json FILE] [--no-split] [--profile-last]
// --json writes the rows as one JSON object (bench/gpu/summary.py reads it beside the PyTorch
// baseline's; bench/gpu/plan_check.py predicts each bf16 row's step from its config_toml);
// --no-split skips the timed steps (for profilers); --profile-last brackets the last measured step
// with cudaProfilerStart/Stop, for `ncu --profile-from-start off` (one steady step, no start-up
// kernels). --precision both runs each model in bf16 and
// then in fp8 (train.precision, model/fp8.h) at the bf16 run's micro-batch, in the same process,
// and prints the fp8 / bf16 tokens/s ratio (summary.py --fp8 tabulates it).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cuda_profiler_api.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "train/runtime.h"
#include "train/mpi_session.h"
#include "train/trainer.h"
#include "kernels/op.h"

namespace tripod {
namespace {

struct Shape {
  const char* name;
  int n_layers, n_heads, d_model;
  bool llama = false;  // with n_kv_heads, ffn_hidden, vocab_size below; GPT-2 otherwise
  int n_kv_heads = 0, ffn_hidden = 0, vocab_size = 50257;
};
constexpr Shape kShapes[] = {{"124M", 12, 12, 768},
                             {"350M", 24, 16, 1024},
                             {"1B", 16, 32, 2048, true, 8, 8192, 128256}};

// How each model runs: the sequence length and the linear layers' precision.
struct RunSettings {
  int seq_len = 1024;
  Precision precision = Precision::Bf16;
  Fp8Recipe recipe = Fp8Recipe::Tensorwise;
  bool profile_last = false;  // the last measured step between cudaProfilerStart and Stop
};

Config make_config(const Shape& s, int micro_batch, const std::string& out_dir, const RunSettings& rs) {
  Config c;
  c.model.n_layers = s.n_layers;
  c.model.n_heads = s.n_heads;
  c.model.d_model = s.d_model;
  c.model.seq_len = rs.seq_len;
  c.train.precision = rs.precision;
  c.train.fp8_recipe = rs.recipe;
  c.model.vocab_size = s.vocab_size;
  if (s.llama) {
    c.model.arch = Arch::Llama;
    c.model.norm = NormKind::RmsNorm;
    c.model.position = PositionKind::Rope;
    c.model.rope_theta = 500000.0;
    c.model.mlp = MlpKind::SwiGlu;
    c.model.ffn_hidden = s.ffn_hidden;
    c.model.n_kv_heads = s.n_kv_heads;
    c.model.bias = false;
    c.model.tie_embeddings = true;
  }
  c.train.device = Device::CUDA;
  c.train.micro_batch_size = micro_batch;
  c.train.global_batch_size = micro_batch;
  c.train.steps = 1000000;
  c.train.lr = 6e-4;
  c.train.log_interval = 1000000;
  c.train.output_dir = out_dir;
  c.data.synthetic = true;
  validate_layout(c, 1);
  return c;
}

struct Result {
  int micro_batch = 0;
  double tokens_per_s = 0, mfu = 0, step_ms = 0;
  int64_t peak_bytes = 0, reserved_bytes = 0;
  double gemm = 0, attention = 0, other = 0;  // shares of the step's wall time; the rest is host gap
  std::map<std::string, double> families;      // every op family's share (op_timing.h)
  std::string attention_impl;
};

bool is_out_of_memory(const std::exception& e) {
  const std::string w = e.what();
  return w.find("out of cuda memory") != std::string::npos || w.find("ALLOC") != std::string::npos ||
         w.find("cudaErrorMemoryAllocation") != std::string::npos;
}

// Runs warmup + measured steps at one micro-batch size; nullopt when it does not fit.
std::optional<Result> run(cuda::CudaOps& ops, ParallelContext& par, const Shape& s, int B, int warmup, int steps,
                          bool split, const std::string& out_dir, const RunSettings& rs) {
  Result r;
  r.micro_batch = B;
  try {
    Config cfg = make_config(s, B, out_dir, rs);
    SyntheticSource data(cfg.model.seq_len, cfg.model.vocab_size, cfg.train.seed);
    Trainer trainer(cfg, ops, par, &data);
    for (int i = 0; i < warmup; ++i) trainer.step();
    double time_s = 0;
    for (int i = 0; i < steps; ++i) {
      const bool profiled = rs.profile_last && i == steps - 1;
      if (profiled) TRIPOD_CUDA_CHECK(cudaProfilerStart(), "cudaProfilerStart");
      StepRecord m = trainer.step();
      if (profiled) TRIPOD_CUDA_CHECK(cudaProfilerStop(), "cudaProfilerStop");
      time_s += m.step_time_s;
      r.mfu += m.mfu / steps;
      r.peak_bytes = std::max<int64_t>(r.peak_bytes, m.memory.at(0).at("total"));
    }
    r.step_ms = 1e3 * time_s / steps;
    r.tokens_per_s = static_cast<double>(B) * cfg.model.seq_len * steps / time_s;
    r.reserved_bytes = static_cast<int64_t>(ops.allocator().reserved_bytes());
    r.attention_impl = ops.attention_impl();
    if (!split) {
      ops.allocator().release_cache();
      return r;
    }
    // The time shares come from separate steps with the per-op events on (they cost a little).
    ops.set_timing(true);
    ops.take_times();
    const int timed = std::max(2, steps / 2);
    double timed_s = 0;
    for (int i = 0; i < timed; ++i) timed_s += trainer.step().step_time_s;
    OpTimes t = ops.take_times();
    ops.set_timing(false);
    r.gemm = t.seconds_of(OpFamily::Gemm) / timed_s;
    r.attention = t.seconds_of(OpFamily::Attention) / timed_s;
    r.other = t.total_seconds() / timed_s - r.gemm - r.attention;
    for (int f = 0; f < kNumOpFamilies; ++f)
      r.families[op_family_name(static_cast<OpFamily>(f))] = t.seconds_of(static_cast<OpFamily>(f)) / timed_s;
  } catch (const std::exception& e) {
    ops.set_timing(false);
    ops.synchronize();
    ops.allocator().release_cache();
    if (is_out_of_memory(e)) return std::nullopt;
    throw;
  }
  ops.allocator().release_cache();
  return r;
}

int bench_main(int argc, char** argv) {
  CLI::App app{"GPU training throughput of GPT-2 124M / 350M and a Llama-3.2-1B shape (bf16 and/or fp8)"};
  std::string model = "all", precision = "bf16", recipe = "tensorwise";
  int micro_batch = 0, steps = 10, warmup = 3, seq = 1024;
  std::string json_path;
  bool no_split = false, profile_last = false;
  app.add_option("--model", model, "124M, 350M, 1B (Llama-3.2-1B-shaped) or all")
      ->check(CLI::IsMember({"124M", "350M", "1B", "all"}));
  app.add_option("--micro-batch", micro_batch, "Micro-batch size (0: the largest that fits)");
  app.add_option("--steps", steps, "Measured steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "Steps before measuring")->check(CLI::NonNegativeNumber);
  app.add_option("--seq", seq, "Sequence length")->check(CLI::Range(16, 131072));
  app.add_option("--precision", precision, "bf16, fp8, or both (bf16 then fp8 at the same micro-batch)")
      ->check(CLI::IsMember({"bf16", "fp8", "both"}));
  app.add_option("--fp8-recipe", recipe, "FP8 scaling: tensorwise or delayed")
      ->check(CLI::IsMember({"tensorwise", "delayed"}));
  app.add_option("--json", json_path, "Also write the results as one JSON object to this file");
  app.add_flag("--no-split", no_split, "Skip the per-op timed steps (GEMM/attention/other/host gap)");
  app.add_flag("--profile-last", profile_last,
               "Bracket the last measured step with cudaProfilerStart/Stop (ncu --profile-from-start off)");
  CLI11_PARSE(app, argc, argv);

  MpiSession mpi;
  TRIPOD_INPUT_CHECK(cuda::device_count() > 0, "tripod_gpu_bench needs a CUDA GPU and none is visible");
  init_logging(0, 1);  // on stderr, so stdout is the table
  spdlog::set_level(spdlog::level::warn);
  Config one_gpu;  // (dp, pp, tp) = (1, 1, 1) on this rank's GPU
  one_gpu.train.device = Device::CUDA;
  one_gpu.parallel.dp = 1;
  Runtime rt = make_runtime(one_gpu);
  auto& ops = dynamic_cast<cuda::CudaOps&>(*rt.ops);
  ParallelContext& par = rt.par;
  const std::string out_dir =
      (std::filesystem::temp_directory_path() / fmt::format("tripod_gpu_bench_{}", getpid())).string();

  const double gib = 1024.0 * 1024.0 * 1024.0;
  nlohmann::json out = {{"bench", "tripod"},
                        {"gpu", ops.device_name()},
                        {"peak_tflops", ops.peak_flops() / 1e12},
                        {"seq_len", seq},
                        {"models", nlohmann::json::array()}};
  fmt::print("GPU 0: {}, MFU against {:.0f} TFLOP/s dense bf16, seq {}\n", ops.device_name(), ops.peak_flops() / 1e12,
             seq);
  fmt::print("{:>6} {:>5} {:>8} {:>5} {:>11} {:>6} {:>9} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6}  {}\n", "model", "prec",
             "params", "B", "tokens/s", "MFU", "step ms", "peak GiB", "resv GiB", "GEMM", "attn", "other", "gap",
             "attention");
  std::vector<Precision> precisions;
  if (precision != "fp8") precisions.push_back(Precision::Bf16);
  if (precision != "bf16") precisions.push_back(Precision::Fp8);
  for (const Shape& s : kShapes) {
    if (model != "all" && model != s.name) continue;
    int chosen_b = micro_batch;  // both: the fp8 run takes the bf16 run's micro-batch
    double bf16_tokens = 0;
    for (Precision p : precisions) {
      const RunSettings rs{
          .seq_len = seq, .precision = p, .recipe = *parse_enum<Fp8Recipe>(recipe), .profile_last = profile_last};
      std::optional<Result> best;
      const std::vector<int> candidates =
          chosen_b > 0 ? std::vector<int>{chosen_b} : std::vector<int>{128, 96, 64, 48, 32, 24, 16, 12, 8, 4, 2, 1};
      for (int B : candidates) {
        best = run(ops, par, s, B, warmup, steps, !no_split, out_dir, rs);
        if (best) break;
        fmt::print(stderr, "{} {}: micro-batch {} does not fit\n", s.name, enum_name(p), B);
      }
      if (!best) {
        fmt::print("{:>6} {:>5}  does not fit{}\n", s.name, enum_name(p),
                   chosen_b > 0 ? fmt::format(" at micro-batch {}", chosen_b) : " even at micro-batch 1");
        continue;
      }
      const Result& r = *best;
      chosen_b = r.micro_batch;
      ModelConfig mc = make_config(s, r.micro_batch, out_dir, rs).model;
      const double gap = no_split ? 0 : 1 - r.gemm - r.attention - r.other;
      fmt::print("{:>6} {:>5} {:>7.1f}M {:>5} {:>11.0f} {:>5.1f}% {:>9.1f} {:>10.2f} {:>10.2f} {:>5.1f}% {:>5.1f}% "
                 "{:>5.1f}% {:>5.1f}%  {}{}\n",
                 s.name, enum_name(p), mc.num_params() / 1e6, r.micro_batch, r.tokens_per_s, 100 * r.mfu, r.step_ms,
                 r.peak_bytes / gib, r.reserved_bytes / gib, 100 * r.gemm, 100 * r.attention, 100 * r.other,
                 100 * gap, r.attention_impl,
                 p == Precision::Fp8 && bf16_tokens > 0
                     ? fmt::format("  (fp8 {}: {:.2f}x bf16)", recipe, r.tokens_per_s / bf16_tokens)
                     : std::string());
      if (p == Precision::Bf16) bf16_tokens = r.tokens_per_s;
      out["models"].push_back({{"model", s.name},
                               {"precision", enum_name(p)},
                               {"fp8_recipe", p == Precision::Fp8 ? recipe : std::string()},
                               {"seq_len", seq},
                               {"params", mc.num_params()},
                               {"micro_batch", r.micro_batch},
                               {"tokens_per_s", r.tokens_per_s},
                               {"mfu", r.mfu},
                               {"step_ms", r.step_ms},
                               {"peak_gib", r.peak_bytes / gib},
                               {"reserved_gib", r.reserved_bytes / gib},
                               {"gemm", r.gemm},
                               {"attention", r.attention},
                               {"other", r.other},
                               {"host_gap", gap},
                               {"families", r.families},
                               {"attention_impl", r.attention_impl},
                               {"arch", mc.arch},
                               // What it trained, for `tripod plan` (run.sh's plan-check stage).
                               {"config_toml", config_to_toml(make_config(s, r.micro_batch, out_dir, rs))}});
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  std::filesystem::remove_all(out_dir);
  return 0;
}

}  // namespace
}  // namespace tripod

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  try {
    return tripod::bench_main(argc, argv);
  } catch (const tripod::InputError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
