// Token (vocabulary-parallel) + position embedding on the CPU.
#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

void CpuOps::embedding_forward(const Tensor& tokens, const Tensor& wte, int64_t vocab_start, const Tensor& wpe,
                               int64_t T, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const int64_t N = tokens.numel(), C = wte.size(1), V = wte.size(0);
  TRIPOD_CHECK(out.numel() == N * C, "embedding out {} for {} tokens of width {}", out.str(), N, C);
  TRIPOD_CHECK(!wpe.defined() || (wpe.size(1) == C && wpe.size(0) >= T && N % T == 0),
               "embedding wpe {} for T={} and N={}", wpe.str(), T, N);
  const int32_t* tok = tokens.data<int32_t>();
  const float* e = wte.data<float>();
  const float* p = wpe.defined() ? wpe.data<float>() : nullptr;
  float* o = out.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    int64_t row = tok[n] - vocab_start;
    float* on = o + n * C;
    const float* pn = p ? p + (n % T) * C : nullptr;
    if (row >= 0 && row < V) {
      const float* en = e + row * C;
      if (pn)
        for (int64_t c = 0; c < C; ++c) on[c] = en[c] + pn[c];
      else
        for (int64_t c = 0; c < C; ++c) on[c] = en[c];
    } else {
      for (int64_t c = 0; c < C; ++c) on[c] = pn ? pn[c] : 0.f;
    }
  }
}

void CpuOps::embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dwte,
                                Tensor& dwpe, int64_t T) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const int64_t N = tokens.numel(), C = dwte.size(1), V = dwte.size(0);
  const int32_t* tok = tokens.data<int32_t>();
  const float* d = dout.data<float>();
  float* de = dwte.data<float>();
  float* dp = dwpe.defined() ? dwpe.data<float>() : nullptr;
  // Threads own column blocks, so the scatter-add has no races and a fixed order.
  constexpr int64_t kCols = 64;
  int64_t nblk = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    int64_t c0 = blk * kCols, c1 = std::min(C, c0 + kCols);
    for (int64_t n = 0; n < N; ++n) {
      const float* dn = d + n * C;
      int64_t row = tok[n] - vocab_start;
      if (row >= 0 && row < V) {
        float* er = de + row * C;
        for (int64_t c = c0; c < c1; ++c) er[c] += dn[c];
      }
      if (dp) {
        float* pr = dp + (n % T) * C;
        for (int64_t c = c0; c < c1; ++c) pr[c] += dn[c];
      }
    }
  }
}

}  // namespace tripod::cpu
