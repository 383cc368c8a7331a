// Token (vocabulary-parallel) + position embedding on the CPU.
#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

namespace {

// out (N, C) = wte rows of the tokens + wpe rows at position_of(n) (none when wpe is null).
template <class PositionOf>
void embed(const int32_t* tok, int64_t N, const float* e, int64_t V, int64_t C, int64_t vocab_start, const float* p,
           PositionOf position_of, float* o) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    int64_t row = tok[n] - vocab_start;
    float* on = o + n * C;
    const float* pn = p ? p + position_of(n) * C : nullptr;
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

// dwte += scatter of the dout rows; dwpe (when not null) += dout rows at position_of(n).
template <class PositionOf>
void embed_backward(const int32_t* tok, int64_t N, const float* d, int64_t V, int64_t C, int64_t vocab_start,
                    float* de, float* dp, PositionOf position_of) {
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
        float* pr = dp + position_of(n) * C;
        for (int64_t c = c0; c < c1; ++c) pr[c] += dn[c];
      }
    }
  }
}

// positions (N) i32, each within the table's P rows.
void check_positions(const Tensor& positions, int64_t N, int64_t P, const char* op) {
  TRIPOD_CHECK(positions.defined() && positions.dtype() == DType::I32 && positions.numel() == N, "{}: positions {} "
               "for {} tokens", op, positions.defined() ? positions.str() : "undefined", N);
  const int32_t* pp = positions.data<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    TRIPOD_CHECK(pp[n] >= 0 && pp[n] < P, "{}: position {} of token {} outside the table's {} rows", op, pp[n], n, P);
}

}  // namespace

void CpuOps::embedding_forward_positions(const Tensor& tokens, const Tensor& wte, int64_t vocab_start,
                                         const Tensor& wpe, const Tensor& positions, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const int64_t N = tokens.numel(), C = wte.size(1), V = wte.size(0);
  TRIPOD_CHECK(out.numel() == N * C && wpe.defined() && wpe.size(1) == C, "embedding out {}, wpe {} for {} tokens of "
               "width {}", out.str(), wpe.defined() ? wpe.str() : "undefined", N, C);
  check_positions(positions, N, wpe.size(0), "embedding_forward_positions");
  const int32_t* pos = positions.data<int32_t>();
  embed(tokens.data<int32_t>(), N, wte.data<float>(), V, C, vocab_start, wpe.data<float>(),
        [pos](int64_t n) { return static_cast<int64_t>(pos[n]); }, out.data<float>());
}

void CpuOps::embedding_backward_positions(const Tensor& tokens, const Tensor& dout, int64_t vocab_start,
                                          Tensor& dwte, Tensor& dwpe, const Tensor& positions) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const int64_t N = tokens.numel(), C = dwte.size(1), V = dwte.size(0);
  if (dwpe.defined()) check_positions(positions, N, dwpe.size(0), "embedding_backward_positions");
  const int32_t* pos = dwpe.defined() ? positions.data<int32_t>() : nullptr;
  embed_backward(tokens.data<int32_t>(), N, dout.data<float>(), V, C, vocab_start, dwte.data<float>(),
                 dwpe.defined() ? dwpe.data<float>() : nullptr, [pos](int64_t n) { return static_cast<int64_t>(pos[n]); });
}

void CpuOps::embedding_forward(const Tensor& tokens, const Tensor& wte, int64_t vocab_start, const Tensor& wpe,
                               int64_t T, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const int64_t N = tokens.numel(), C = wte.size(1), V = wte.size(0);
  TRIPOD_CHECK(out.numel() == N * C, "embedding out {} for {} tokens of width {}", out.str(), N, C);
  TRIPOD_CHECK(!wpe.defined() || (wpe.size(1) == C && wpe.size(0) >= T && N % T == 0),
               "embedding wpe {} for T={} and N={}", wpe.str(), T, N);
  embed(tokens.data<int32_t>(), N, wte.data<float>(), V, C, vocab_start, wpe.defined() ? wpe.data<float>() : nullptr,
        [T](int64_t n) { return n % T; }, out.data<float>());
}

void CpuOps::embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dwte,
                                Tensor& dwpe, int64_t T) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const int64_t N = tokens.numel(), C = dwte.size(1), V = dwte.size(0);
  embed_backward(tokens.data<int32_t>(), N, dout.data<float>(), V, C, vocab_start, dwte.data<float>(),
                 dwpe.defined() ? dwpe.data<float>() : nullptr, [T](int64_t n) { return n % T; });
}

}  // namespace tripod::cpu
