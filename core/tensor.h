// Tensor: a dtype, a shape and contiguous storage from an allocator. No autograd.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace tripod {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "(2, 3, 4)"

// Owned bytes, handed back to the allocator (and uncharged) when the last tensor using them dies.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  MemCategory category = MemCategory::Workspace;
  Allocator* allocator = nullptr;  // null: not owned (wrapped memory)
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;
  // New uninitialised tensor charged to `category`.
  static Tensor empty(Allocator& alloc, Shape shape, DType dtype, MemCategory category);
  // A tensor over memory owned elsewhere (host buffers, views into files).
  static Tensor wrap(void* data, Shape shape, DType dtype, Device device = Device::CPU);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const { return shape_.at(d < 0 ? d + dim() : d); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::CPU; }
  MemCategory category() const { return storage_ ? storage_->category : MemCategory::Workspace; }

  void* raw() const { return static_cast<char*>(storage_->data) + offset_; }
  template <class T> T* data() const {
    TRIPOD_CHECK(dtype_of<T>() == dtype_, "tensor of {} read as {}", dtype_name(dtype_), dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }

  // Same bytes, another shape of the same element count.
  Tensor view(Shape shape) const;
  // Rows [begin, end) of the first dimension.
  Tensor slice(int64_t begin, int64_t end) const;
  // Elements [begin, end) of the flattened tensor, as a 1-D tensor.
  Tensor flat(int64_t begin, int64_t end) const;

  std::string str() const;  // "f32(2, 3) cpu"
  // The bytes' owner, weakly: whether a tensor seen before still holds the same bytes (a cache
  // keyed by it cannot be fooled by a later tensor reusing the freed address).
  std::weak_ptr<const Storage> storage_ref() const { return storage_; }

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace tripod
