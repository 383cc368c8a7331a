// The two FP8 formats of the OCP 8-bit floating point specification (OFP8, 2023), as Hopper's
// tensor cores and Transformer Engine use them, and the conversions every backend shares:
//   e4m3 ("E4M3FN"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; S.1111.111 is
//        NaN; largest finite 448 (S.1111.110); smallest subnormal 2^-9.
//   e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like: S.11111.00 is infinity,
//        S.11111.{01,10,11} NaN; largest finite 57344; smallest subnormal 2^-16.
// f32 -> FP8 is what the GPU's saturating conversion (cvt.rn.satfinite, __NV_SATFINITE) does:
// round to nearest, ties to even; a magnitude above the largest finite value (infinity included)
// becomes the largest finite value with its sign; NaN becomes the canonical NaN 0x7f; signed
// zeros keep their sign. The CPU backend emulates the GPU's FP8 GEMM operands with these
// functions, bit for bit (tests/unit/test_fp8.cpp checks them against a table built from the
// specification; tests/cuda against the hardware conversion on every f32).
//
// Plain C++ with no dependency, so that nvcc compiles it into the CUDA kernels as well.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define TRIPOD_FP8_FN __host__ __device__ __forceinline__
#else
#define TRIPOD_FP8_FN inline
#endif

namespace tripod {

enum class Fp8Format : uint8_t { E4M3, E5M2 };

inline constexpr float kFp8E4M3Max = 448.f;
inline constexpr float kFp8E5M2Max = 57344.f;
inline constexpr uint8_t kFp8NaN = 0x7f;  // the canonical NaN of both formats

constexpr float fp8_max(Fp8Format f) { return f == Fp8Format::E4M3 ? kFp8E4M3Max : kFp8E5M2Max; }

// Whether a scaled value v is clipped: its nearest FP8 value, had the format one more binade,
// would lie beyond the largest finite value (e4m3: |v| > 464, where 464 = 448 + half its ulp still
// rounds to 448 (ties to even); e5m2: |v| >= 61440, whose tie would round up). Saturation maps
// it to the largest value; values between the largest and this bound only round down to it.
TRIPOD_FP8_FN bool fp8_clipped(float v, Fp8Format f) {
  const float a = v < 0.f ? -v : v;
  return f == Fp8Format::E4M3 ? a > 464.f : a >= 61440.f;
}

namespace fp8_detail {

TRIPOD_FP8_FN uint32_t bits_of(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
TRIPOD_FP8_FN float float_of(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// f32 -> FP8 with M mantissa bits, exponent bias B, largest finite value `max_bits` (its f32 bits)
// and code `max_code`. In FP8's normal range the f32 bits are rounded to M mantissa bits in place
// (a carry moves the exponent) and rebiased; below it, values are multiples of the subnormal
// spacing 2^(1-B-M), rounded by rintf (ties to even). Worked example (e4m3, M = 3, B = 7):
// 0.3f = 0x3e99999a = 1.0011001...b x 2^-2; the 20 bits below the kept 3 are 0x9999a, above half,
// so the kept bits 0x3e9 round up to 0x3ea; rebiased, 0x3ea - (120 << 3) = 0x2a = 0 0101 010
// = 1.25 x 2^-2 = 0.3125. Branch-free but for the selects, so that loops over it vectorise.
template <int M, int B>
TRIPOD_FP8_FN uint8_t encode(float f, uint32_t max_bits, uint32_t max_code) {
  constexpr int kShift = 23 - M;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 + 1 - B) << 23;     // 2^(1-B)
  constexpr uint32_t kSubnormalScale = static_cast<uint32_t>(127 + B + M - 1) << 23;  // 2^(B+M-1)
  constexpr uint32_t kRebias = static_cast<uint32_t>(127 - B) << M;
  const uint32_t u = bits_of(f);
  const uint32_t sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  const uint32_t normal = ((a + (1u << (kShift - 1)) - 1u + ((a >> kShift) & 1u)) >> kShift) - kRebias;
  const float tiny = float_of(a < kMinNormal ? a : kMinNormal);  // in range for the conversion to an integer
  const uint32_t subnormal = static_cast<uint32_t>(rintf(tiny * float_of(kSubnormalScale)));
  uint32_t code = a >= kMinNormal ? normal : subnormal;
  code = a > max_bits ? max_code : code;  // beyond the largest finite value (infinity too): saturate
  return static_cast<uint8_t>(a > 0x7f800000u ? kFp8NaN : (code | sign));
}

}  // namespace fp8_detail

TRIPOD_FP8_FN uint8_t fp8_e4m3_from_float(float f) { return fp8_detail::encode<3, 7>(f, 0x43e00000u, 0x7e); }
TRIPOD_FP8_FN uint8_t fp8_e5m2_from_float(float f) { return fp8_detail::encode<2, 15>(f, 0x47600000u, 0x7b); }

TRIPOD_FP8_FN float fp8_e4m3_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24, exp = (b >> 3) & 0xfu, man = b & 0x7u;
  if (exp == 0xf && man == 0x7) return fp8_detail::float_of(0x7fc00000u | sign);  // NaN
  if (exp == 0) return fp8_detail::float_of(sign | fp8_detail::bits_of(static_cast<float>(man) * 0.001953125f));  // man x 2^-9
  return fp8_detail::float_of(sign | ((exp - 7 + 127) << 23) | (man << 20));
}

TRIPOD_FP8_FN float fp8_e5m2_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24, exp = (b >> 2) & 0x1fu, man = b & 0x3u;
  if (exp == 0x1f) return fp8_detail::float_of(sign | (man ? 0x7fc00000u : 0x7f800000u));  // NaN, infinity
  if (exp == 0) return fp8_detail::float_of(sign | fp8_detail::bits_of(static_cast<float>(man) * 1.52587890625e-05f));  // man x 2^-16
  return fp8_detail::float_of(sign | ((exp - 15 + 127) << 23) | (man << 21));
}

TRIPOD_FP8_FN uint8_t fp8_from_float(float f, Fp8Format fmt) {
  return fmt == Fp8Format::E4M3 ? fp8_e4m3_from_float(f) : fp8_e5m2_from_float(f);
}
TRIPOD_FP8_FN float fp8_to_float(uint8_t b, Fp8Format fmt) {
  return fmt == Fp8Format::E4M3 ? fp8_e4m3_to_float(b) : fp8_e5m2_to_float(b);
}

// The scaling both recipes share (Transformer Engine's formula): the scale that maps `amax` onto
// the format's largest value, divided by 2^margin: s = (max / amax) * 2^-margin. An amax of 0 or
// one that is not finite keeps `previous` (1 for a tensor of its own, the last scale under delayed
// scaling); a scale that overflows (a subnormal amax) becomes the largest f32.
TRIPOD_FP8_FN float fp8_scale_from_amax(float amax, float fmt_max, float margin_factor, float previous) {
  if (!(amax > 0.f) || !(amax < 3.402823466e38f)) return previous;
  float s = fmt_max / amax;
  if (!(s < 3.402823466e38f)) s = 3.402823466e38f;
  s *= margin_factor;  // a power of two: exact unless it underflows
  return s > 0.f ? s : previous;
}

}  // namespace tripod
