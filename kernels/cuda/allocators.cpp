// cudaMalloc / cudaMallocHost behind the caching allocator.
#include "kernels/cuda/allocators.h"

#include "kernels/cuda/cuda_check.h"

namespace tripod::cuda {

void* DeviceAllocator::raw_allocate(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it so later checks do not report it
    return nullptr;
  }
  TRIPOD_CUDA_CHECK(err, "device allocation of {} bytes", bytes);
  return p;
}

void DeviceAllocator::raw_free(void* ptr) {
  // Called from destructors too: report, never throw.
  cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) cudaGetLastError();
}

void* PinnedAllocator::raw_allocate(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMallocHost(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  TRIPOD_CUDA_CHECK(err, "pinned host allocation of {} bytes", bytes);
  return p;
}

void PinnedAllocator::raw_free(void* ptr) {
  cudaError_t err = cudaFreeHost(ptr);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading) cudaGetLastError();
}

}  // namespace tripod::cuda
