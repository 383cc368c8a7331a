// FP8 on the CPU: the exact emulation of the CUDA backend's FP8 operands (the same bytes from the
// same inputs and scales, kernels/fp8.h), and their GEMM in f32 through OpenBLAS.
#include <cblas.h>

#include <array>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/fp8.h"

namespace tripod::cpu {

namespace {

// Scratch whose elements are written before they are read: no zero fill.
template <class T> struct Uninit : std::allocator<T> {
  template <class U> struct rebind {
    using other = Uninit<U>;
  };
  Uninit() = default;
  template <class U> Uninit(const Uninit<U>&) {}
  template <class U> void construct(U* p) { ::new (static_cast<void*>(p)) U; }
};

Fp8Format format_of(const Tensor& t, const char* op, const char* name) {
  TRIPOD_CHECK(is_fp8(t.dtype()), "{}: {} must be f8e4m3 or f8e5m2, got {}", op, name, t.str());
  return t.dtype() == DType::F8E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
}

// The 256 values of a format, for decoding GEMM operands (exact: every FP8 value is an f32).
const std::array<float, 256>& decode_table(Fp8Format f) {
  static const auto tables = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (int b = 0; b < 256; ++b) {
      t[0][b] = fp8_e4m3_to_float(static_cast<uint8_t>(b));
      t[1][b] = fp8_e5m2_to_float(static_cast<uint8_t>(b));
    }
    return t;
  }();
  return tables[f == Fp8Format::E4M3 ? 0 : 1];
}

// max |x| with NaN winning (compared as the bits of |x|: every NaN is above infinity), so that the
// result does not depend on the order of the elements.
uint32_t abs_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u & 0x7fffffffu;
}

float amax_of(const float* x, int64_t n) {
  const int64_t nblk = (n + kReduceBlock - 1) / kReduceBlock;
  std::vector<uint32_t> part(std::max<int64_t>(nblk, 1), 0);
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    uint32_t m = 0;
    for (int64_t i = blk * kReduceBlock, e = std::min(n, i + kReduceBlock); i < e; ++i) m = std::max(m, abs_bits(x[i]));
    part[blk] = m;
  }
  uint32_t m = 0;
  for (uint32_t p : part) m = std::max(m, p);
  float out;
  std::memcpy(&out, &m, 4);
  return out;
}

}  // namespace

void CpuOps::bias_backward(const Tensor& dy, Tensor& db) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  const int64_t O = db.numel(), N = dy.numel() / std::max<int64_t>(O, 1);
  TRIPOD_CHECK(O > 0 && dy.numel() == N * O, "bias_backward dy {} db {}", dy.str(), db.str());
  column_sums(dy.data<float>(), N, O, db.data<float>());
}

void CpuOps::fp8_amax(const Tensor& x, Tensor& amax) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  TRIPOD_CHECK(amax.numel() == 1 && amax.dtype() == DType::F32, "fp8_amax: amax must be (1) f32, got {}", amax.str());
  amax.data<float>()[0] = amax_of(x.data<float>(), x.numel());
}

void CpuOps::fp8_scale(const Tensor& amaxes, float fmt_max, int margin, Tensor& scale, Tensor& record) {
  TRIPOD_CHECK(scale.numel() == 2 && scale.dtype() == DType::F32 && amaxes.numel() >= 1,
               "fp8_scale: amaxes {} scale {} (want (P) and (2) f32)", amaxes.str(), scale.str());
  const float a = amax_of(amaxes.data<float>(), amaxes.numel());
  if (record.defined() && abs_bits(a) > abs_bits(record.data<float>()[0])) record.data<float>()[0] = a;
  const float s = fp8_scale_from_amax(a, fmt_max, std::ldexp(1.f, -margin), 1.f);
  scale.data<float>()[0] = s;
  scale.data<float>()[1] = 1.f / s;
}

void CpuOps::fp8_quantize(const Tensor& x, const Tensor& scale, Tensor& q, Tensor& qt, Tensor& amax,
                          Tensor& saturated) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  const Tensor& any = q.defined() ? q : qt;
  const Fp8Format fmt = format_of(any, "fp8_quantize", q.defined() ? "q" : "qt");
  TRIPOD_CHECK(any.dim() == 2 && x.numel() == any.numel() && scale.numel() == 2 && x.dtype() == DType::F32,
               "fp8_quantize x {} q {} qt {} scale {}", x.str(), q.str(), qt.str(), scale.str());
  const int64_t R = q.defined() ? q.size(0) : qt.size(1), C = q.defined() ? q.size(1) : qt.size(0);
  TRIPOD_CHECK(!q.defined() || !qt.defined() ||
                   (qt.dtype() == q.dtype() && qt.dim() == 2 && qt.size(0) == C && qt.size(1) == R),
               "fp8_quantize: qt {} must be q {} transposed", qt.str(), q.str());
  const float* px = x.data<float>();
  const float s = scale.data<float>()[0];
  const int64_t n = R * C;
  std::vector<uint8_t> scratch(q.defined() ? 0 : static_cast<size_t>(n));
  uint8_t* pq = q.defined() ? static_cast<uint8_t*>(q.raw()) : scratch.data();
  int64_t clipped = 0;
  if (fmt == Fp8Format::E4M3) {
#pragma omp parallel for schedule(static) reduction(+ : clipped)
    for (int64_t i = 0; i < n; ++i) {
      const float v = px[i] * s;
      clipped += fp8_clipped(v, Fp8Format::E4M3) ? 1 : 0;
      pq[i] = fp8_e4m3_from_float(v);
    }
  } else {
#pragma omp parallel for schedule(static) reduction(+ : clipped)
    for (int64_t i = 0; i < n; ++i) {
      const float v = px[i] * s;
      clipped += fp8_clipped(v, Fp8Format::E5M2) ? 1 : 0;
      pq[i] = fp8_e5m2_from_float(v);
    }
  }
  if (qt.defined()) {
    uint8_t* pt = static_cast<uint8_t*>(qt.raw());
    constexpr int64_t kTile = 64;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += kTile)
      for (int64_t r0 = 0; r0 < R; r0 += kTile)
        for (int64_t c = c0; c < std::min(C, c0 + kTile); ++c)
          for (int64_t r = r0; r < std::min(R, r0 + kTile); ++r) pt[c * R + r] = pq[r * C + c];
  }
  if (amax.defined()) {
    float* pa = amax.data<float>();
    const float m = amax_of(px, n);
    if (abs_bits(m) > abs_bits(pa[0])) pa[0] = m;
  }
  if (saturated.defined()) saturated.data<float>()[0] += static_cast<float>(clipped);
}

void CpuOps::fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                      const Tensor& bias, bool accumulate, Tensor& out, Tensor& out_amax) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  const Fp8Format fa = format_of(a, "fp8_gemm", "a"), fb = format_of(b, "fp8_gemm", "b");
  TRIPOD_CHECK(!(fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2), "fp8_gemm: a {} and b {} are both e5m2", a.str(),
               b.str());
  TRIPOD_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), "fp8_gemm: a {} and b {} must be (R, K), (C, K)",
               a.str(), b.str());
  const int64_t R = a.size(0), K = a.size(1), C = b.size(0);
  TRIPOD_CHECK(out.numel() == R * C, "fp8_gemm: out {} for a {} b {}", out.str(), a.str(), b.str());
  TRIPOD_CHECK(K % 16 == 0 && C % 16 == 0, "fp8_gemm: K = {} and C = {} must be multiples of 16 (cuBLASLt's FP8 rule)",
               K, C);
  TRIPOD_CHECK(!accumulate || !bias.defined(), "fp8_gemm: a bias with accumulate");
  const auto& ta = decode_table(fa);
  const auto& tb = decode_table(fb);
  std::vector<float, Uninit<float>> da(static_cast<size_t>(R * K)), db(static_cast<size_t>(C * K));
  const auto* pa = static_cast<const uint8_t*>(a.raw());
  const auto* pb = static_cast<const uint8_t*>(b.raw());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < R * K; ++i) da[i] = ta[pa[i]];
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < C * K; ++i) db[i] = tb[pb[i]];
  // cuBLASLt's alpha: the product of the two dequantization scales.
  const float alpha = a_scale.data<float>()[1] * b_scale.data<float>()[1];
  float* po = out.data<float>();
  float beta = accumulate ? 1.f : 0.f;
  if (bias.defined()) {
    const float* pbias = bias.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) std::memcpy(po + r * C, pbias, C * sizeof(float));
    beta = 1.f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, C, K, alpha, da.data(), K, db.data(), K, beta, po, C);
  if (out_amax.defined()) {
    const float m = amax_of(po, R * C);
    if (abs_bits(m) > abs_bits(out_amax.data<float>()[0])) out_amax.data<float>()[0] = m;
  }
}

}  // namespace tripod::cpu
