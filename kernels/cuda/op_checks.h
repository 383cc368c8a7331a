// Argument checks shared by the CUDA ops: a wrong device, dtype or size is a bug in the caller and
// fails with the op, the argument and its shape.
#pragma once

#include "core/tensor.h"

namespace tripod::cuda {

inline void expect_on_device(const Tensor& t, const char* op, const char* name) {
  TRIPOD_CHECK(t.defined() && t.device() == Device::CUDA, "{}: {} must be a CUDA tensor, got {}", op, name,
               t.defined() ? t.str() : "undefined");
}

inline void expect_dtype(const Tensor& t, DType dt, const char* op, const char* name) {
  TRIPOD_CHECK(t.dtype() == dt, "{}: {} must be {}, got {}", op, name, dtype_name(dt), t.str());
}

// On the device, of dtype dt and with n elements.
inline void expect(const Tensor& t, DType dt, int64_t n, const char* op, const char* name) {
  expect_on_device(t, op, name);
  expect_dtype(t, dt, op, name);
  TRIPOD_CHECK(t.numel() == n, "{}: {} must have {} elements, got {}", op, name, n, t.str());
}

}  // namespace tripod::cuda
