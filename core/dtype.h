// Element types of tensors and their sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tripod {

// F64: host-side reductions only (sums across ranks that must not round at f32).
// F8E4M3, F8E5M2: the OCP FP8 formats (kernels/fp8.h), operands of FP8 GEMMs (train.precision =
// "fp8"); written only by Ops::fp8_quantize, copied only as they are (no conversion).
enum class DType : uint8_t { F32, BF16, I32, F64, F8E4M3, F8E5M2 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::F64: return 8;
    case DType::F8E4M3: return 1;
    case DType::F8E5M2: return 1;
  }
  return 0;
}

constexpr bool is_fp8(DType t) { return t == DType::F8E4M3 || t == DType::F8E5M2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::F64: return "f64";
    case DType::F8E4M3: return "f8e4m3";
    case DType::F8E5M2: return "f8e5m2";
  }
  return "?";
}

// bfloat16 on the host: the upper half of an fp32, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {  // NaN stays NaN
      bits = static_cast<uint16_t>((u >> 16) | 0x40);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<uint16_t>(u >> 16);
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }

}  // namespace tripod
