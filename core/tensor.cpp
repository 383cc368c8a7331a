// Tensor construction and views.
#include "core/tensor.h"

namespace tripod {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) { return fmt::format("({})", fmt::join(s, ", ")); }

Storage::~Storage() {
  if (allocator) allocator->deallocate(data, bytes, category);
}

Tensor Tensor::empty(Allocator& alloc, Shape shape, DType dtype, MemCategory category) {
  for (int64_t d : shape) TRIPOD_CHECK(d >= 0, "negative size in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  auto st = std::make_shared<Storage>();
  st->bytes = t.nbytes();
  st->device = alloc.device();
  st->category = category;
  st->data = alloc.allocate(st->bytes, category);
  st->allocator = &alloc;
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  auto st = std::make_shared<Storage>();
  st->data = data;
  st->bytes = t.nbytes();
  st->device = device;
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::view(Shape shape) const {
  TRIPOD_CHECK(shape_numel(shape) == numel(), "view {} of a tensor of shape {}", shape_str(shape), shape_str(shape_));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  TRIPOD_CHECK(dim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice [{}, {}) of shape {}", begin,
               end, shape_str(shape_));
  Tensor t = *this;
  int64_t row = numel() / std::max<int64_t>(shape_[0], 1);
  t.offset_ += static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::flat(int64_t begin, int64_t end) const {
  TRIPOD_CHECK(0 <= begin && begin <= end && end <= numel(), "flat [{}, {}) of {} elements", begin, end, numel());
  Tensor t = *this;
  t.offset_ += static_cast<size_t>(begin) * dtype_size(dtype_);
  t.shape_ = {end - begin};
  return t;
}

std::string Tensor::str() const {
  return fmt::format("{}{} {}", dtype_name(dtype_), shape_str(shape_), device_name(device()));
}

}  // namespace tripod
