// The GPU's FP8 conversion against kernels/fp8.h's on every f32 (fp8_conversion_check.cu).
#pragma once

#include <cstdint>
#include <string>

namespace tripod::test {

struct Fp8ConversionCheck {
  unsigned long long mismatches = 0;
  unsigned int first_mismatch = 0xffffffffu;  // the smallest f32 bit pattern that differs
  std::string error;                          // a CUDA error, or empty
};

// Converts all 2^32 f32 bit patterns to e4m3 (or e5m2) with the hardware's saturating conversion
// and with fp8_e4m3_from_float (fp8_e5m2_from_float) on the current GPU, and counts the differences.
Fp8ConversionCheck fp8_check_every_float(bool e5m2);

}  // namespace tripod::test
