// Helpers of the CUDA tests: a GPU check that skips with the reason, random inputs rounded to
// bf16 (so the CPU backend and the GPU see the same numbers), uploads, downloads, NaN-poisoned
// outputs and the relative error ||got - want|| / ||want||.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/op.h"

namespace tripod::test {

#define TRIPOD_REQUIRE_GPU()                                                                                  \
  do {                                                                                                        \
    if (::tripod::cuda_device_count() == 0)                                                                   \
      GTEST_SKIP() << "no CUDA GPU: the CUDA backend is compiled, but this check needs a GPU to run";         \
  } while (0)

inline constexpr double kBf16Tol = 1e-2;  // outputs stored in bf16
inline constexpr double kF32Tol = 1e-5;   // f32 outputs from f32 (or exactly representable) inputs

// N(0, scale^2) values (plus `shift`) on the host, f32; rounded to bf16 values unless `exact`.
inline Tensor randn(Ops& cpu, const Shape& shape, uint64_t stream, float scale = 1.f, float shift = 0.f,
                    bool exact = false) {
  Tensor t = cpu.empty(shape, DType::F32, MemCategory::Workspace);
  CounterRng rng(1234, stream);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v = static_cast<float>(rng.normal(static_cast<uint64_t>(i))) * scale + shift;
    p[i] = exact ? v : static_cast<float>(bf16(v));
  }
  return t;
}

inline Tensor ints(Ops& cpu, const std::vector<int32_t>& v) {
  Tensor t = cpu.empty({static_cast<int64_t>(v.size())}, DType::I32, MemCategory::Workspace);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// A device copy of a host tensor, converted to `dt`.
inline Tensor upload(Ops& gpu, const Tensor& host, DType dt) {
  Tensor d = gpu.empty(host.shape(), dt, MemCategory::Workspace);
  gpu.copy(host, d);
  return d;
}

// A host f32 copy of a device tensor.
inline Tensor download(Ops& gpu, Ops& cpu, const Tensor& dev) {
  Tensor h = cpu.empty(dev.shape(), dev.dtype() == DType::I32 ? DType::I32 : DType::F32, MemCategory::Workspace);
  gpu.copy(dev, h);
  return h;
}

// A device output filled with NaN, so any element a kernel fails to write shows up.
inline Tensor poisoned(Ops& gpu, const Shape& shape, DType dt) {
  Tensor t = gpu.empty(shape, dt, MemCategory::Workspace);
  gpu.fill(t, std::numeric_limits<float>::quiet_NaN());
  return t;
}

// ||got - want|| / ||want|| over host f32 tensors; infinite when got has a NaN/inf where want
// is finite (an unwritten or broken element).
inline double rel_err(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.numel(), want.numel());
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::isfinite(w[i]) && !std::isfinite(g[i])) return std::numeric_limits<double>::infinity();
    double d = static_cast<double>(g[i]) - w[i];
    num += d * d;
    den += static_cast<double>(w[i]) * w[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline Tensor clone(Ops& cpu, const Tensor& t) {
  Tensor c = cpu.empty(t.shape(), t.dtype(), MemCategory::Workspace);
  cpu.copy(t, c);
  return c;
}

}  // namespace tripod::test
