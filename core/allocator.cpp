// The caching allocator and its CPU implementation.
#include "core/allocator.h"

#include <cstdlib>

#include "core/error.h"

namespace tripod {

size_t Allocator::round_size(size_t bytes) {
  // Small blocks round to 512 B; large ones to 1/16 of their power of two, so few bins exist.
  if (bytes <= 512) return 512;
  size_t p = 1;
  while (p < bytes) p <<= 1;
  size_t step = std::max<size_t>(512, p / 16);
  return (bytes + step - 1) / step * step;
}

void* Allocator::allocate(size_t bytes, MemCategory category) {
  size_t size = round_size(bytes);
  void* ptr = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
    }
  }
  if (!ptr) {
    ptr = raw_allocate(size);
    if (!ptr) {
      release_cache();
      ptr = raw_allocate(size);
    }
    TRIPOD_CHECK(ptr, "out of {} memory allocating {} bytes for {} ({} bytes held)",
                 device_name(device()), bytes, mem_category_name(category), reserved_);
    std::lock_guard lock(mu_);
    reserved_ += size;
  }
  std::lock_guard lock(mu_);
  stats_.charge(category, static_cast<int64_t>(bytes));
  return ptr;
}

void Allocator::deallocate(void* ptr, size_t bytes, MemCategory category) {
  std::lock_guard lock(mu_);
  stats_.release(category, static_cast<int64_t>(bytes));
  free_[round_size(bytes)].push_back(ptr);
}

void Allocator::release_cache() {
  std::lock_guard lock(mu_);
  for (auto& [size, ptrs] : free_) {
    for (void* p : ptrs) raw_free(p);
    reserved_ -= size * ptrs.size();
  }
  free_.clear();
}

void* CpuAllocator::raw_allocate(size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
void CpuAllocator::raw_free(void* ptr) { std::free(ptr); }

}  // namespace tripod
