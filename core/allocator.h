// Allocators hand out device or host bytes and charge them to a memory category.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/device.h"
#include "core/memory_stats.h"

namespace tripod {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns storage of at least `bytes` bytes (64-byte aligned), charged to `category`.
  void* allocate(size_t bytes, MemCategory category);
  void deallocate(void* ptr, size_t bytes, MemCategory category);
  MemoryStats& stats() { return stats_; }
  const MemoryStats& stats() const { return stats_; }
  // Bytes held from the system, including cached free blocks.
  size_t reserved_bytes() const { return reserved_; }
  // Returns cached free blocks to the system.
  void release_cache();

 protected:
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_free(void* ptr) = 0;

 private:
  // A caching allocator: freed blocks are kept in exact-size bins and reused, so the per
  // micro-batch activations do not go back to the OS (page faults on CPU, cudaMalloc syncs on GPU).
  static size_t round_size(size_t bytes);
  MemoryStats stats_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  size_t reserved_ = 0;
};

class CpuAllocator final : public Allocator {
 public:
  ~CpuAllocator() override { release_cache(); }
  Device device() const override { return Device::CPU; }

 protected:
  void* raw_allocate(size_t bytes) override;
  void raw_free(void* ptr) override;
};

}  // namespace tripod
