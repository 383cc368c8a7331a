// Fill, copy, elementwise arithmetic and reductions on the CPU.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

namespace {

void check_cpu(const Tensor& t, const char* what) {
  TRIPOD_CHECK(t.device() == Device::CPU, "{}: tensor {} is not on the CPU", what, t.str());
}

template <class Src, class Dst> void convert(const Src* s, Dst* d, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<Dst, bf16>)
      d[i] = bf16(static_cast<float>(s[i]));
    else if constexpr (std::is_same_v<Src, bf16>)
      d[i] = static_cast<Dst>(static_cast<float>(s[i]));
    else
      d[i] = static_cast<Dst>(s[i]);
  }
}

template <class Src> void convert_to(const Src* s, const Tensor& dst, int64_t n) {
  switch (dst.dtype()) {
    case DType::F32: convert(s, dst.data<float>(), n); break;
    case DType::BF16: convert(s, dst.data<bf16>(), n); break;
    case DType::I32: convert(s, dst.data<int32_t>(), n); break;
    case DType::F64: convert(s, dst.data<double>(), n); break;
    case DType::F8E4M3:
    case DType::F8E5M2: TRIPOD_FAIL("copy to {}: FP8 tensors are written by fp8_quantize only", dst.str());
  }
}

}  // namespace

void CpuOps::fill(Tensor& t, float value) {
  ScopedTimer timer(*this, OpFamily::Memory);
  check_cpu(t, "fill");
  int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::F32: {
      float* p = t.data<float>();
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      break;
    }
    case DType::BF16: {
      bf16* p = t.data<bf16>();
      bf16 v(value);
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      break;
    }
    case DType::I32: {
      int32_t* p = t.data<int32_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value);
      break;
    }
    case DType::F64: {
      double* p = t.data<double>();
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      break;
    }
    case DType::F8E4M3:
    case DType::F8E5M2: TRIPOD_FAIL("fill {}: FP8 tensors are written by fp8_quantize only", t.str());
  }
}

void CpuOps::copy(const Tensor& src, Tensor& dst) {
  ScopedTimer timer(*this, OpFamily::Memory);
  check_cpu(src, "copy");
  check_cpu(dst, "copy");
  TRIPOD_CHECK(src.numel() == dst.numel(), "copy {} -> {}", src.str(), dst.str());
  int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    if (src.raw() != dst.raw()) std::memcpy(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  switch (src.dtype()) {
    case DType::F32: convert_to(src.data<float>(), dst, n); break;
    case DType::BF16: convert_to(src.data<bf16>(), dst, n); break;
    case DType::I32: convert_to(src.data<int32_t>(), dst, n); break;
    case DType::F64: convert_to(src.data<double>(), dst, n); break;
    case DType::F8E4M3:
    case DType::F8E5M2: TRIPOD_FAIL("copy {} -> {}: an FP8 tensor copies only to the same format", src.str(), dst.str());
  }
}

void CpuOps::gather_rows(const Tensor& x, const Tensor& index, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Memory);
  check_cpu(x, "gather_rows");
  check_cpu(out, "gather_rows");
  const int64_t R = out.dim() >= 1 ? out.size(0) : 0;
  if (R == 0) return;
  const int64_t W = out.numel() / R, rows = W > 0 ? x.numel() / W : 0;
  TRIPOD_CHECK(x.dtype() == out.dtype() && x.dtype() != DType::F64,
               "gather_rows: x {} and out {} must share a dtype (f32, bf16 or i32)", x.str(), out.str());
  TRIPOD_CHECK(index.dtype() == DType::I32 && index.numel() >= R && W > 0 && x.numel() % W == 0,
               "gather_rows: x {} index {} out {}", x.str(), index.str(), out.str());
  const size_t bytes = static_cast<size_t>(W) * dtype_size(x.dtype());
  const auto* px = static_cast<const char*>(x.raw());
  auto* po = static_cast<char*>(out.raw());
  const int32_t* pi = index.data<int32_t>();
  for (int64_t r = 0; r < R; ++r)
    TRIPOD_CHECK(pi[r] < rows, "gather_rows: index[{}] = {} is past the {} rows of x", r, pi[r], rows);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    if (pi[r] < 0)
      std::memset(po + r * bytes, 0, bytes);
    else
      std::memcpy(po + r * bytes, px + static_cast<int64_t>(pi[r]) * bytes, bytes);
  }
}

void CpuOps::add(const Tensor& a, const Tensor& b, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  TRIPOD_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add {} + {} -> {}", a.str(), b.str(), out.str());
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  int64_t n = a.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
}

void CpuOps::accumulate(Tensor& dst, const Tensor& src) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  TRIPOD_CHECK(dst.numel() == src.numel(), "accumulate {} += {}", dst.str(), src.str());
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  int64_t n = dst.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

void CpuOps::scale(Tensor& t, float s) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  float* p = t.data<float>();
  int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

namespace {

// Sums f(i) over [begin, end) in fixed blocks, then the blocks in order: the result does not
// depend on the number of threads. Within a block, 8 running sums (element i into sum i mod 8,
// added in order at the end) let the loop vectorise: one sum's chain of dependent adds ran at
// the adder's latency, 0.57 ns per element.
template <class F> double blocked_sum(int64_t begin, int64_t end, F f) {
  constexpr int kLanes = 8;
  int64_t nblocks = (end - begin + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> partial(nblocks, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    int64_t b = begin + blk * kReduceBlock, e = std::min(end, b + kReduceBlock);
    double lanes[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lanes[l] += f(i + l);
    for (int l = 0; i < e; ++i, ++l) lanes[l] += f(i);
    double s = 0;
    for (double x : lanes) s += x;
    partial[blk] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

double CpuOps::sum_squares(const Tensor& t, std::span<const FlatRange> ranges) {
  ScopedTimer timer(*this, OpFamily::Reduction);
  const float* p = t.data<float>();
  double total = 0;
  for (const FlatRange& r : ranges) {
    TRIPOD_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= t.numel(), "range [{}, {}) of {}", r.begin, r.end,
                 t.str());
    total += blocked_sum(r.begin, r.end, [p](int64_t i) { return static_cast<double>(p[i]) * p[i]; });
  }
  return total;
}

double CpuOps::sum(const Tensor& t) {
  ScopedTimer timer(*this, OpFamily::Reduction);
  const float* p = t.data<float>();
  return blocked_sum(0, t.numel(), [p](int64_t i) { return static_cast<double>(p[i]); });
}

Ops::DeviceInfo CpuOps::device_info() const {
  DeviceInfo info;
  info.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  // The largest cache this core sees (sysfs "index*/size", e.g. "32768K"); glibc's sysconf
  // reports the whole package's L3 on some machines, sysfs the slice a core shares.
  for (int i = 0; i < 8; ++i) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string size;
    if (!(f >> size) || size.empty()) continue;
    int64_t bytes = 0;
    try {
      bytes = std::stoll(size);
    } catch (const std::exception&) {
      continue;
    }
    const char unit = size.back();
    bytes *= unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : unit == 'G' ? int64_t{1} << 30 : 1;
    info.cache_bytes = std::max(info.cache_bytes, bytes);
  }
  if (info.cache_bytes == 0) info.cache_bytes = std::max<int64_t>(0, sysconf(_SC_LEVEL3_CACHE_SIZE));
  return info;
}

}  // namespace tripod::cpu
