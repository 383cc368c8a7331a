// Linear layers on the CPU: OpenBLAS sgemm, bias in f32.
#include <cblas.h>

#include <chrono>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

void CpuOps::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  const int64_t O = w.size(0), I = w.numel() / O, N = x.numel() / I;
  TRIPOD_CHECK(x.numel() == N * I && y.numel() == N * O, "linear x {} w {} y {}", x.str(), w.str(), y.str());
  float* py = y.data<float>();
  float beta = 0.f;
  if (b.defined()) {
    const float* pb = b.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) std::memcpy(py + n * O, pb, O * sizeof(float));
    beta = 1.f;
  }
  // y (N, O) = x (N, I) . w^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, O, I, 1.f, x.data<float>(), I, w.data<float>(), I, beta,
              py, O);
}

namespace {
// dx (N, I) = dy (N, O) . w (O, I)
void input_grad(const Tensor& dy, const Tensor& w, Tensor& dx) {
  const int64_t O = w.size(0), I = w.numel() / O, N = dy.numel() / O;
  TRIPOD_CHECK(dy.numel() == N * O && dx.numel() == N * I, "linear input grad dy {} w {} dx {}", dy.str(), w.str(),
               dx.str());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, I, O, 1.f, dy.data<float>(), O, w.data<float>(), I, 0.f,
              dx.data<float>(), I);
}

// dw (O, I) += dy^T (O, N) . x (N, I); db (O) += column sums of dy.
void weight_grad(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db) {
  const int64_t O = dw.size(0), I = dw.numel() / O, N = x.numel() / I;
  TRIPOD_CHECK(dy.numel() == N * O && x.numel() == N * I, "linear weight grad dy {} x {} dw {}", dy.str(), x.str(),
               dw.str());
  const float* pdy = dy.data<float>();
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, N, 1.f, pdy, O, x.data<float>(), I, 1.f,
              dw.data<float>(), I);
  if (db.defined()) column_sums(pdy, N, O, db.data<float>());
}
}  // namespace

void column_sums(const float* dy, int64_t N, int64_t O, float* db) {
  constexpr int64_t kCols = 256;
  int64_t nblk = (O + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    int64_t c0 = blk * kCols, c1 = std::min(O, c0 + kCols);
    float s[kCols] = {};
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = c0; c < c1; ++c) s[c - c0] += dy[n * O + c];
    for (int64_t c = c0; c < c1; ++c) db[c] += s[c - c0];
  }
}

void CpuOps::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                             Tensor& db) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  const int64_t O = w.size(0), I = w.numel() / O, N = x.numel() / I;
  TRIPOD_CHECK(dy.numel() == N * O && dw.numel() == O * I, "linear backward dy {} x {} dw {}", dy.str(), x.str(),
               dw.str());
  if (dx.defined()) input_grad(dy, w, dx);
  weight_grad(dy, x, dw, db);
}

void CpuOps::linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  input_grad(dy, w, dx);
}

void CpuOps::linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  weight_grad(dy, x, dw, db);
}

double CpuOps::peak_flops() {
  if (peak_flops_ > 0) return peak_flops_;
  // Best of a few square sgemms big enough to run at full speed.
  const int n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s);
  }
  peak_flops_ = best;
  return best;
}

}  // namespace tripod::cpu
