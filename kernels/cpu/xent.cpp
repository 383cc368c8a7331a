// Fused softmax cross-entropy over (vocabulary-parallel) logits on the CPU.
#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

void CpuOps::xent_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid,
                        Tensor& stats) {
  ScopedTimer timer(*this, OpFamily::Xent);
  const int64_t N = targets.numel(), V = logits.numel() / N;
  TRIPOD_CHECK(stats.numel() == 3 * N && valid <= V, "xent stats {} for logits {}, valid {}", stats.str(),
               logits.str(), valid);
  const float* pl = logits.data<float>();
  const int32_t* pt = targets.data<int32_t>();
  float* ps = stats.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (pt[n] < 0) {  // a token that does not count: lse and loss 0 once the shards are combined
      ps[3 * n + 0] = 0.f;
      ps[3 * n + 1] = vocab_start == 0 ? 1.f : 0.f;
      ps[3 * n + 2] = 0.f;
      continue;
    }
    const float* row = pl + n * V;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, row[j]);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < valid; ++j) s += fast_exp(row[j] - m);
    // NaN anywhere in the row must reach the loss (max would skip it).
    bool nan = s != s;
    int64_t t = pt[n] - vocab_start;
    ps[3 * n + 0] = nan ? NAN : m;
    ps[3 * n + 1] = s;
    ps[3 * n + 2] = (t >= 0 && t < valid) ? row[t] : 0.f;
  }
}

void CpuOps::xent_combine(const Tensor& parts, Tensor& lse, Tensor& loss) {
  ScopedTimer timer(*this, OpFamily::Xent);
  const int64_t P = parts.size(0), N = parts.size(1);
  const float* pp = parts.data<float>();
  float* pl = lse.data<float>();
  float* ploss = loss.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float m = -INFINITY;
    for (int64_t p = 0; p < P; ++p) m = std::max(m, pp[(p * N + n) * 3]);
    float s = 0, target = 0;
    bool nan = false;
    for (int64_t p = 0; p < P; ++p) {
      const float* st = pp + (p * N + n) * 3;
      nan |= st[0] != st[0];
      if (st[1] > 0) s += st[1] * fast_exp(st[0] - m);
      target += st[2];
    }
    float l = m + std::log(s);
    pl[n] = nan ? NAN : l;
    ploss[n] = nan ? NAN : l - target;
  }
}

void CpuOps::xent_backward(Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid,
                           const Tensor& lse, float scale) {
  ScopedTimer timer(*this, OpFamily::Xent);
  const int64_t N = targets.numel(), V = logits.numel() / N;
  float* pl = logits.data<float>();
  const int32_t* pt = targets.data<int32_t>();
  const float* plse = lse.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = pl + n * V;
    if (pt[n] < 0) {  // not counted: no gradient
      for (int64_t j = 0; j < V; ++j) row[j] = 0.f;
      continue;
    }
    float l = plse[n];
#pragma omp simd
    for (int64_t j = 0; j < valid; ++j) row[j] = fast_exp(row[j] - l) * scale;
    for (int64_t j = valid; j < V; ++j) row[j] = 0.f;
    int64_t t = pt[n] - vocab_start;
    if (t >= 0 && t < valid) row[t] -= scale;
  }
}

}  // namespace tripod::cpu
