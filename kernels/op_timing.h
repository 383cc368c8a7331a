// Per-op-family time, recorded by each backend around its own ops (Ops::set_timing,
// Ops::take_times): what share of a step goes to GEMMs, attention, norms, the optimizer, ...
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tripod {

// The families the backend's ops are timed in; every op belongs to exactly one.
enum class OpFamily {
  Gemm,         // linear_*, grouped_linear_* (and linear_gelu_forward where it is one fused GEMM)
  Attention,    // attention_forward, attention_backward, attention_decode, rope
  LayerNorm,    // layernorm_*, rmsnorm_*, qk_norm_*
  Gelu,         // gelu_*, swiglu_*
  Xent,         // xent_stats, xent_combine, xent_backward
  Embedding,    // embedding_forward, embedding_backward
  Optimizer,    // adamw
  Elementwise,  // add, accumulate, scale
  Memory,       // fill, copy
  Reduction,    // sum, sum_squares
  Moe,          // moe_route*, moe_dispatch, moe_permute, moe_unpermute, moe_combine_backward
};
inline constexpr int kNumOpFamilies = 11;

// The family's name in tables: "gemm", "attention", "layernorm", ...
inline const char* op_family_name(OpFamily f) {
  static constexpr const char* kNames[kNumOpFamilies] = {
      "gemm",        "attention", "layernorm", "gelu",      "xent", "embedding",
      "optimizer",   "elementwise", "memory",  "reduction", "moe"};
  return kNames[static_cast<int>(f)];
}

// The time and number of ops per family since timing was last taken: wall time on the CPU (its
// ops run synchronously), GPU time between events around each op on CUDA.
struct OpTimes {
  std::array<double, kNumOpFamilies> seconds{};
  std::array<int64_t, kNumOpFamilies> calls{};

  void add(OpFamily f, double s) {
    seconds[static_cast<int>(f)] += s;
    ++calls[static_cast<int>(f)];
  }
  double seconds_of(OpFamily f) const { return seconds[static_cast<int>(f)]; }
  int64_t calls_of(OpFamily f) const { return calls[static_cast<int>(f)]; }
  double total_seconds() const {
    double t = 0;
    for (double s : seconds) t += s;
    return t;
  }
  int64_t total_calls() const {
    int64_t n = 0;
    for (int64_t c : calls) n += c;
    return n;
  }
};

// One rank's training step by where its time went: the families `tripod plan --check` compares,
// alike for the cost model's prediction (plan/cost_model) and a profiled step of a run
// (train.profile_steps, train/trainer). Seconds; the parts add up to `step`.
//   gemm, attention   those op families inside the pipeline's actions (OpFamily::Gemm, Attention)
//   elementwise       every other op inside the actions: norms, GELU/SwiGLU, residual adds, the
//                     embedding, the cross-entropy, copies and fills (and MoE's routing)
//   communication     exposed communication: inside the actions, the TP, CP and EP collectives
//                     (a GPU's device time outside the ops; a CPU's MPI waits, waiting for the peers
//                     included), and the DP reduction after the backward; `plan --check` moves a
//                     rank's part beyond the least of its pipeline stage's ranks to pipeline_idle
//   pipeline_idle     waiting between actions (the bubble, stage-to-stage messages), for the other
//                     ranks at the step's world all-reduce and, in `plan --check`, for a slower rank
//                     of the stage in its collectives
//   optimizer         zeroing the gradients, the grad norm, AdamW, the distributed optimizer's gather
//   other             the rest of the step (a CPU's host time between ops, data loading, trace and log
//                     writing); the cost model predicts none
struct StepBreakdown {
  double gemm = 0, attention = 0, elementwise = 0, communication = 0, pipeline_idle = 0, optimizer = 0, other = 0;
  double step = 0;

  static constexpr int kParts = 7;
  // The parts in table order, by index (0 .. kParts-1), and their names ("gemm", ...,
  // "pipeline_idle", "other").
  double& part(int i) {
    double* p[kParts] = {&gemm, &attention, &elementwise, &communication, &pipeline_idle, &optimizer, &other};
    return *p[i];
  }
  double part(int i) const { return const_cast<StepBreakdown*>(this)->part(i); }
  static std::string_view part_name(int i) {
    static constexpr std::string_view kNames[kParts] = {"gemm",          "attention", "elementwise", "communication",
                                                        "pipeline_idle", "optimizer", "other"};
    return kNames[i];
  }
  double parts_sum() const {
    double s = 0;
    for (int i = 0; i < kParts; ++i) s += part(i);
    return s;
  }
};

}  // namespace tripod
