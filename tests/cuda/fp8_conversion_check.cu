// For tests/cuda/cuda_kernels_test.cpp: the GPU's own saturating FP8 conversion (cvt.rn.satfinite,
// what the CUDA backend's casts use) against kernels/fp8.h's (the CPU backend's emulation, compiled
// here for the device: the same source as on the host) on every one of the 2^32 f32 bit patterns.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/fp8.h"
#include "tests/cuda/fp8_conversion_check.h"

namespace tripod::test {

namespace {

__global__ void compare_kernel(bool e5m2, unsigned long long* mismatches, unsigned int* first_bad) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32); i += stride) {
    const float f = __uint_as_float(static_cast<unsigned int>(i));
    const uint8_t hw = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
    const uint8_t ours = e5m2 ? fp8_e5m2_from_float(f) : fp8_e4m3_from_float(f);
    if (hw != ours) {
      ++bad;
      atomicMin(first_bad, static_cast<unsigned int>(i));
    }
  }
  if (bad) atomicAdd(mismatches, bad);
}

}  // namespace

Fp8ConversionCheck fp8_check_every_float(bool e5m2) {
  unsigned long long* d_count = nullptr;
  unsigned int* d_first = nullptr;
  Fp8ConversionCheck out;
  if (cudaMalloc(&d_count, sizeof(*d_count)) != cudaSuccess || cudaMalloc(&d_first, sizeof(*d_first)) != cudaSuccess) {
    out.error = "cudaMalloc failed";
    return out;
  }
  const unsigned long long zero = 0;
  const unsigned int none = 0xffffffffu;
  cudaMemcpy(d_count, &zero, sizeof(zero), cudaMemcpyHostToDevice);
  cudaMemcpy(d_first, &none, sizeof(none), cudaMemcpyHostToDevice);
  compare_kernel<<<4096, 256>>>(e5m2, d_count, d_first);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) out.error = cudaGetErrorString(err);
  cudaMemcpy(&out.mismatches, d_count, sizeof(out.mismatches), cudaMemcpyDeviceToHost);
  cudaMemcpy(&out.first_mismatch, d_first, sizeof(out.first_mismatch), cudaMemcpyDeviceToHost);
  cudaFree(d_count);
  cudaFree(d_first);
  return out;
}

}  // namespace tripod::test
