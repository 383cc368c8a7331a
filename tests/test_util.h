// Helpers shared by the tests: host tensors, deterministic random fills, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace tripod::test {

// Standard base64 with padding (tiktoken rank files, which the tests write).
inline std::string base64(std::string_view s) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < s.size(); i += 3) {
    uint32_t w = static_cast<uint32_t>(static_cast<unsigned char>(s[i])) << 16;
    if (i + 1 < s.size()) w |= static_cast<uint32_t>(static_cast<unsigned char>(s[i + 1])) << 8;
    if (i + 2 < s.size()) w |= static_cast<unsigned char>(s[i + 2]);
    out += t[w >> 18];
    out += t[(w >> 12) & 63];
    out += i + 1 < s.size() ? t[(w >> 6) & 63] : '=';
    out += i + 2 < s.size() ? t[w & 63] : '=';
  }
  return out;
}

// A host allocator that lives as long as the test process.
inline CpuAllocator& host_alloc() {
  static CpuAllocator a;
  return a;
}

inline Tensor host_tensor(Shape shape, DType dt = DType::F32) {
  return Tensor::empty(host_alloc(), std::move(shape), dt, MemCategory::Workspace);
}

inline Tensor random_tensor(Shape shape, uint64_t seed, float scale = 1.f) {
  Tensor t = host_tensor(std::move(shape));
  CounterRng rng(seed, 17);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.normal(i)) * scale;
  return t;
}

inline std::vector<double> to_double(const Tensor& t) {
  std::vector<double> v(t.numel());
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = p[i];
  return v;
}

// Largest |a-b| / (atol + rtol*|b|) over the elements; <= 1 passes.
inline double worst_ratio(const float* a, const double* b, int64_t n, double atol, double rtol, int64_t* where = nullptr) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    double r = std::abs(a[i] - b[i]) / (atol + rtol * std::abs(b[i]));
    if (!(r <= worst)) {  // NaN counts as worst
      worst = std::isnan(r) ? INFINITY : r;
      if (where) *where = i;
    }
  }
  return worst;
}

#define EXPECT_CLOSE(tensor, ref_vec, atol, rtol)                                                     \
  do {                                                                                                \
    int64_t _w = -1;                                                                                  \
    double _r = ::tripod::test::worst_ratio((tensor).template data<float>(), (ref_vec).data(),       \
                                            (tensor).numel(), atol, rtol, &_w);                       \
    EXPECT_LE(_r, 1.0) << #tensor << " element " << _w << ": got "                                    \
                       << ((_w >= 0) ? (tensor).template data<float>()[_w] : 0.f) << " want "         \
                       << ((_w >= 0) ? (ref_vec)[_w] : 0.0);                                          \
  } while (0)

inline std::string source_dir() {
  const char* s = std::getenv("TRIPOD_SOURCE_DIR");
  return s ? s : TRIPOD_SOURCE_PATH;
}

}  // namespace tripod::test
