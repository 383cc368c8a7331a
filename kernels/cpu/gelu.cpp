// GELU with the tanh approximation (GPT-2's), forward and backward, on the CPU.
#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;

// tanh through exp, so the loop vectorises: tanh(u) = 1 - 2 / (exp(2u) + 1).
inline float tanh_f(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }
}  // namespace

void CpuOps::gelu_forward(const Tensor& x, Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Gelu);
  const float* px = x.data<float>();
  float* py = y.data<float>();
  int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float v = px[i];
    float u = kS * (v + kA * v * v * v);
    py[i] = 0.5f * v * (1.0f + tanh_f(u));
  }
}

void CpuOps::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  ScopedTimer timer(*this, OpFamily::Gelu);
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float v = px[i];
    float u = kS * (v + kA * v * v * v);
    float t = tanh_f(u);
    float sech2 = 1.0f - t * t;
    float grad = 0.5f * (1.0f + t) + 0.5f * v * sech2 * kS * (1.0f + 3.0f * kA * v * v);
    pdx[i] = grad * pdy[i];
  }
}

}  // namespace tripod::cpu
