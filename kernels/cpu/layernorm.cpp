// LayerNorm forward and backward on the CPU (statistics in f32 as GPT-2 does).
#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

void CpuOps::layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y,
                               Tensor& mean, Tensor& rstd) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const int64_t C = w.numel(), N = x.numel() / C;
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
  float* pm = mean.data<float>();
  float* pr = rstd.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = px + n * C;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += xn[c];
    float m = s / C;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (xn[c] - m) * (xn[c] - m);
    float r = 1.0f / std::sqrt(v / C + eps);
    float* yn = py + n * C;
    for (int64_t c = 0; c < C; ++c) yn[c] = (xn[c] - m) * r * pw[c] + pb[c];
    pm[n] = m;
    pr[n] = r;
  }
}

void CpuOps::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                const Tensor& rstd, Tensor& dx, Tensor& dw, Tensor& db) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const int64_t C = w.numel(), N = x.numel() / C;
  const float* pdy = dy.data<float>();
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  TRIPOD_CHECK(dw.defined() == db.defined(), "layernorm_backward: dw and db go together (dw {} db {})", dw.str(),
               db.str());
  // Either half may be skipped (a split backward); each is computed the same way either way.
  float* pdx = dx.defined() ? dx.data<float>() : nullptr;
  float* pdw = dw.defined() ? dw.data<float>() : nullptr;
  float* pdb = db.defined() ? db.data<float>() : nullptr;
  // dx by rows.
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (!pdx) continue;
    const float* dyn = pdy + n * C;
    const float* xn = px + n * C;
    float m = pm[n], r = pr[n];
    float dnorm_mean = 0, dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int64_t c = 0; c < C; ++c) {
      float norm = (xn[c] - m) * r;
      float dnorm = pw[c] * dyn[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    float* dxn = pdx + n * C;
    for (int64_t c = 0; c < C; ++c) {
      float norm = (xn[c] - m) * r;
      float dnorm = pw[c] * dyn[c];
      dxn[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
    }
  }
  // dw, db by column blocks (each thread owns columns; rows summed in order).
  if (!pdw) return;
  constexpr int64_t kCols = 64;
  int64_t nblk = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    int64_t c0 = blk * kCols, c1 = std::min(C, c0 + kCols);
    float sw[kCols] = {}, sb[kCols] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* dyn = pdy + n * C;
      const float* xn = px + n * C;
      float m = pm[n], r = pr[n];
      for (int64_t c = c0; c < c1; ++c) {
        sw[c - c0] += dyn[c] * (xn[c] - m) * r;
        sb[c - c0] += dyn[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      pdw[c] += sw[c - c0];
      pdb[c] += sb[c - c0];
    }
  }
}

}  // namespace tripod::cpu
