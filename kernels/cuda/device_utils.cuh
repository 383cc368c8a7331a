// Device-side helpers shared by the .cu files: bf16 <-> f32, warp reductions, vector packs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace tripod::cuda::k {

using bf16_t = __nv_bfloat16;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16_t v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(int32_t v) { return static_cast<float>(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ int32_t from_float<int32_t>(float v) { return static_cast<int32_t>(v); }

// The host bf16 and the device __nv_bfloat16 are the same 16 bits.
inline const bf16_t* dev(const bf16* p) { return reinterpret_cast<const bf16_t*>(p); }
inline bf16_t* dev(bf16* p) { return reinterpret_cast<bf16_t*>(p); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// N elements of T moved as one aligned load or store (16 bytes when N * sizeof(T) == 16).
template <class T, int N> struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than needed.
inline unsigned blocks_for(int64_t n, int threads, int64_t cap = 8192) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b);
}

}  // namespace tripod::cuda::k
