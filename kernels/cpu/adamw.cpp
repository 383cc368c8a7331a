// AdamW with decoupled weight decay on the CPU.
#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

void CpuOps::adamw(Tensor& master, const Tensor& grads, Tensor& m, Tensor& v, std::span<const FlatRange> ranges,
                   const AdamWHyper& h, Tensor& compute_copy) {
  ScopedTimer timer(*this, OpFamily::Optimizer);
  float* p = master.data<float>();
  const float* g = grads.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  float* copy = compute_copy.defined() ? compute_copy.data<float>() : nullptr;
  const float bc1 = 1.0f - std::pow(h.beta1, static_cast<float>(h.step));
  const float bc2 = 1.0f - std::pow(h.beta2, static_cast<float>(h.step));
  for (const FlatRange& r : ranges) {
    const float wd = r.decay ? h.weight_decay : 0.f;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = r.begin; i < r.end; ++i) {
      float gi = g[i] * h.grad_scale;
      float mi = h.beta1 * pm[i] + (1.0f - h.beta1) * gi;
      float vi = h.beta2 * pv[i] + (1.0f - h.beta2) * gi * gi;
      pm[i] = mi;
      pv[i] = vi;
      float mhat = mi / bc1, vhat = vi / bc2;
      float pi = p[i] - h.lr * (mhat / (std::sqrt(vhat) + h.eps) + wd * p[i]);
      p[i] = pi;
      if (copy) copy[i] = pi;
    }
  }
}

}  // namespace tripod::cpu
