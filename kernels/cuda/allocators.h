// Memory of the CUDA backend: device memory (cudaMalloc) and pinned host memory (cudaMallocHost),
// both through core/allocator.h's caching Allocator, so bytes are charged to the same categories
// as on the CPU and freed blocks are reused without going back to the driver.
#pragma once

#include "core/allocator.h"

namespace tripod::cuda {

// Device memory of the current GPU. Blocks freed by tensors are reused at once: every kernel runs
// on the backend's compute stream in issue order, and each NCCL communicator's stream joins it before
// and after each transfer (see CudaOps), so a reused block is never still being read or written.
class DeviceAllocator final : public Allocator {
 public:
  ~DeviceAllocator() override { release_cache(); }
  Device device() const override { return Device::CUDA; }

 protected:
  // Null when the GPU is out of memory (the base class then frees its cache and retries).
  void* raw_allocate(size_t bytes) override;
  void raw_free(void* ptr) override;
};

// Page-locked host memory for staging transfers (MpiComm); its tensors are host (CPU) tensors.
class PinnedAllocator final : public Allocator {
 public:
  ~PinnedAllocator() override { release_cache(); }
  Device device() const override { return Device::CPU; }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_free(void* ptr) override;
};

}  // namespace tripod::cuda
