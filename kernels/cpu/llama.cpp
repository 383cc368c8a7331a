// The Llama-family ops on the CPU: RMSNorm, rotary embeddings and SwiGLU, forward and backward.
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

void CpuOps::rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const int64_t C = w.numel(), N = x.numel() / C;
  TRIPOD_CHECK(y.numel() == N * C && rstd.numel() == N, "rmsnorm x {} w {} y {} rstd {}", x.str(), w.str(), y.str(),
               rstd.str());
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  float* py = y.data<float>();
  float* pr = rstd.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = px + n * C;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += xn[c] * xn[c];
    const float r = 1.0f / std::sqrt(ss / C + eps);
    float* yn = py + n * C;
    for (int64_t c = 0; c < C; ++c) yn[c] = xn[c] * r * pw[c];
    pr[n] = r;
  }
}

void CpuOps::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                              Tensor& dw) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const int64_t C = w.numel(), N = x.numel() / C;
  const float* pdy = dy.data<float>();
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const float* pr = rstd.data<float>();
  // Either half may be skipped (a split backward); each is computed the same way either way.
  float* pdx = dx.defined() ? dx.data<float>() : nullptr;
  float* pdw = dw.defined() ? dw.data<float>() : nullptr;
  // dx = r (w dy - xhat mean(w dy xhat)), xhat = x r.
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    if (!pdx) continue;
    const float* dyn = pdy + n * C;
    const float* xn = px + n * C;
    const float r = pr[n];
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < C; ++c) dot += pw[c] * dyn[c] * xn[c] * r;
    dot /= C;
    float* dxn = pdx + n * C;
    for (int64_t c = 0; c < C; ++c) dxn[c] += (pw[c] * dyn[c] - xn[c] * r * dot) * r;
  }
  // dw by column blocks, rows summed in order (independent of the thread count).
  if (!pdw) return;
  constexpr int64_t kCols = 64;
  const int64_t nblk = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int64_t c0 = blk * kCols, c1 = std::min(C, c0 + kCols);
    float sw[kCols] = {};
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = c0; c < c1; ++c) sw[c - c0] += pdy[n * C + c] * px[n * C + c] * pr[n];
    for (int64_t c = c0; c < c1; ++c) pdw[c] += sw[c - c0];
  }
}

namespace {

// cos and sin per (position, i) for positions [pos0, pos0 + P), in double then rounded.
void rope_table(int64_t pos0, int64_t P, int64_t D, double theta, bool inverse, std::vector<float>& cs,
                std::vector<float>& sn) {
  const int64_t h = D / 2;
  cs.resize(static_cast<size_t>(P * h));
  sn.resize(static_cast<size_t>(P * h));
  for (int64_t t = 0; t < P; ++t)
    for (int64_t i = 0; i < h; ++i) {
      const double a = static_cast<double>(pos0 + t) * std::pow(theta, -2.0 * static_cast<double>(i) / D);
      cs[t * h + i] = static_cast<float>(std::cos(a));
      sn[t * h + i] = static_cast<float>(inverse ? -std::sin(a) : std::sin(a));
    }
}

// Rotates the first rot_heads heads of every row n of x (N, Hs, D) by the table's row row_of(n).
template <class RowOf>
void rotate(float* p, int64_t N, int64_t Hs, int64_t D, int64_t rot_heads, const std::vector<float>& cs,
            const std::vector<float>& sn, RowOf row_of) {
  const int64_t h = D / 2;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* c = cs.data() + row_of(n) * h;
    const float* s = sn.data() + row_of(n) * h;
    for (int64_t hd = 0; hd < rot_heads; ++hd) {
      float* v = p + (n * Hs + hd) * D;
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) {
        const float a = v[i], b = v[i + h];
        v[i] = a * c[i] - b * s[i];
        v[i + h] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace

void CpuOps::rope(Tensor& x, int64_t rot_heads, int64_t T, int64_t pos0, double theta, bool inverse) {
  ScopedTimer timer(*this, OpFamily::Attention);
  TRIPOD_CHECK(x.dim() == 3 && x.size(2) % 2 == 0 && rot_heads <= x.size(1) && T >= 1 && x.size(0) % T == 0,
               "rope: x {} must be (N, heads, D) with D even, N a multiple of T = {}, rot_heads {}", x.str(), T,
               rot_heads);
  const int64_t N = x.size(0), Hs = x.size(1), D = x.size(2);
  std::vector<float> cs, sn;
  rope_table(pos0, T, D, theta, inverse, cs, sn);
  rotate(x.data<float>(), N, Hs, D, rot_heads, cs, sn, [T](int64_t n) { return n % T; });
}

void CpuOps::rope_positions(Tensor& x, int64_t rot_heads, const Tensor& positions, double theta, bool inverse) {
  ScopedTimer timer(*this, OpFamily::Attention);
  TRIPOD_CHECK(x.dim() == 3 && x.size(2) % 2 == 0 && rot_heads <= x.size(1) && positions.defined() &&
                   positions.dtype() == DType::I32 && positions.numel() == x.size(0),
               "rope_positions: x {} must be (N, heads, D) with D even and positions (N) i32, got {}, rot_heads {}",
               x.str(), positions.defined() ? positions.str() : "undefined", rot_heads);
  const int64_t N = x.size(0), Hs = x.size(1), D = x.size(2);
  const int32_t* pos = positions.data<int32_t>();
  int64_t P = 1;
  for (int64_t n = 0; n < N; ++n) {
    TRIPOD_CHECK(pos[n] >= 0, "rope_positions: position {} of row {}", pos[n], n);
    P = std::max<int64_t>(P, pos[n] + 1);
  }
  std::vector<float> cs, sn;
  rope_table(0, P, D, theta, inverse, cs, sn);
  rotate(x.data<float>(), N, Hs, D, rot_heads, cs, sn, [pos](int64_t n) { return static_cast<int64_t>(pos[n]); });
}

namespace {
inline float sigmoid(float v) { return 1.0f / (1.0f + fast_exp(-v)); }
}  // namespace

void CpuOps::swiglu_forward(const Tensor& gu, Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Gelu);
  const int64_t F = y.size(y.dim() - 1), N = y.numel() / F;
  TRIPOD_CHECK(gu.numel() == 2 * N * F, "swiglu gu {} y {}", gu.str(), y.str());
  const float* pg = gu.data<float>();
  float* py = y.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = pg + n * 2 * F;
    const float* u = g + F;
    float* yn = py + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) yn[f] = g[f] * sigmoid(g[f]) * u[f];
  }
}

void CpuOps::swiglu_backward(const Tensor& gu, const Tensor& dy, Tensor& dgu) {
  ScopedTimer timer(*this, OpFamily::Gelu);
  const int64_t F = dy.size(dy.dim() - 1), N = dy.numel() / F;
  TRIPOD_CHECK(gu.numel() == 2 * N * F && dgu.numel() == gu.numel(), "swiglu backward gu {} dy {} dgu {}", gu.str(),
               dy.str(), dgu.str());
  const float* pg = gu.data<float>();
  const float* pdy = dy.data<float>();
  float* pd = dgu.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = pg + n * 2 * F;
    const float* u = g + F;
    const float* d = pdy + n * F;
    float* dg = pd + n * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float s = sigmoid(g[f]), silu = g[f] * s;
      du[f] = d[f] * silu;
      dg[f] = d[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
    }
  }
}

}  // namespace tripod::cpu
