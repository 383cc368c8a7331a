// FP8 conversions (kernels/fp8.h) against the OCP 8-bit floating point specification, and the CPU
// backend's FP8 ops against references in double:
//   - every one of the 256 e4m3 and e5m2 bit patterns decodes to the value the specification's
//     definition gives ((-1)^s 2^(e - bias) (1 + m / 2^M), subnormals 2^(1 - bias) m / 2^M; e4m3's
//     S.1111.111 NaN and no infinity, e5m2's IEEE infinities and NaNs);
//   - f32 -> FP8 matches an independent rounding built from that table (the nearest of the
//     format's values, ties to the even code, beyond the largest value the largest value, NaN the
//     canonical NaN) at every rounding boundary (each value, each midpoint and the floats beside
//     them), around the largest value and the smallest subnormal, at zeros, infinities, NaNs and
//     f32 subnormals, and on a few million random floats;
//   - the scale rule, the clipped count, and fp8_amax / fp8_scale / fp8_quantize / fp8_gemm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"
#include "kernels/fp8.h"
#include "kernels/op.h"
#include "test_util.h"

namespace tripod {
namespace {

struct Format {
  const char* name;
  Fp8Format fmt;
  int E, M, bias;
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
};
const Format kFormats[] = {{"e4m3", Fp8Format::E4M3, 4, 3, 7, fp8_e4m3_from_float, fp8_e4m3_to_float},
                           {"e5m2", Fp8Format::E5M2, 5, 2, 15, fp8_e5m2_from_float, fp8_e5m2_to_float}};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The value of a bit pattern by the specification's definition, in double; NaN as quiet NaN.
double spec_value(const Format& f, int code) {
  const int s = code >> 7, e = (code >> f.M) & ((1 << f.E) - 1), m = code & ((1 << f.M) - 1);
  const int emax = (1 << f.E) - 1;
  const double sign = s ? -1.0 : 1.0;
  if (f.fmt == Fp8Format::E4M3 && e == emax && m == (1 << f.M) - 1) return std::numeric_limits<double>::quiet_NaN();
  if (f.fmt == Fp8Format::E5M2 && e == emax)
    return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return sign * std::ldexp(static_cast<double>(m) / (1 << f.M), 1 - f.bias);
  return sign * std::ldexp(1.0 + static_cast<double>(m) / (1 << f.M), e - f.bias);
}

// The format's finite non-negative values in increasing order, with their codes: the table the
// reference rounding searches.
std::vector<std::pair<double, int>> finite_values(const Format& f) {
  std::vector<std::pair<double, int>> v;
  for (int c = 0; c < 128; ++c) {
    const double x = spec_value(f, c);
    if (std::isfinite(x)) v.push_back({x, c});
  }
  std::sort(v.begin(), v.end());
  return v;
}

// f32 -> FP8 by the specification's rules, independently of kernels/fp8.h: NaN -> 0x7f; beyond
// the largest finite value (infinity too) -> the largest, with the sign; else the nearest value of
// the table, a tie to the even code; the sign kept (negative values rounding to zero give -0).
uint8_t reference_encode(const std::vector<std::pair<double, int>>& table, float x) {
  if (std::isnan(x)) return 0x7f;
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= table.back().first) return static_cast<uint8_t>(sign | table.back().second);
  auto hi = std::lower_bound(table.begin(), table.end(), std::pair<double, int>{a, -1});
  if (hi->first == a) return static_cast<uint8_t>(sign | hi->second);
  auto lo = hi - 1;
  const double dlo = a - lo->first, dhi = hi->first - a;
  const int code = dlo < dhi ? lo->second : dhi < dlo ? hi->second : ((lo->second & 1) == 0 ? lo->second : hi->second);
  return static_cast<uint8_t>(sign | code);
}

TEST(Fp8Format, EveryBitPatternDecodesToTheSpecificationsValue) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    int nans = 0, infs = 0;
    for (int c = 0; c < 256; ++c) {
      const double want = spec_value(f, c);
      const float got = f.decode(static_cast<uint8_t>(c));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "code " << c;
        ++nans;
        continue;
      }
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;  // -0 too
      infs += std::isinf(want) ? 1 : 0;
    }
    // e4m3 ("FN"): only S.1111.111 is NaN, no infinity; e5m2: 2 infinities, 6 NaNs.
    EXPECT_EQ(nans, f.fmt == Fp8Format::E4M3 ? 2 : 6);
    EXPECT_EQ(infs, f.fmt == Fp8Format::E4M3 ? 0 : 2);
  }
  // The landmarks the specification names.
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.f, -9));
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.f, -6));
  EXPECT_EQ(fp8_e5m2_to_float(0x7b), 57344.f);
  EXPECT_EQ(fp8_e5m2_to_float(0x01), std::ldexp(1.f, -16));
  EXPECT_EQ(fp8_e5m2_to_float(0x04), std::ldexp(1.f, -14));
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_float(0x7c)) && std::isinf(fp8_e5m2_to_float(0xfc)));
  EXPECT_EQ(kFp8E4M3Max, fp8_e4m3_to_float(0x7e));
  EXPECT_EQ(kFp8E5M2Max, fp8_e5m2_to_float(0x7b));
}

TEST(Fp8Format, RoundingMatchesTheSpecificationAtEveryBoundary) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const auto table = finite_values(f);
    std::vector<float> xs;
    auto around = [&](float v) {
      xs.push_back(v);
      xs.push_back(std::nextafter(v, 0.f));
      xs.push_back(std::nextafter(v, std::numeric_limits<float>::infinity()));
    };
    for (size_t i = 0; i < table.size(); ++i) {
      around(static_cast<float>(table[i].first));
      if (i + 1 < table.size()) around(static_cast<float>((table[i].first + table[i + 1].first) / 2));  // exact in f32
    }
    // Beyond the largest value: the midpoint to the next binade's first value and far beyond.
    const double top = table.back().first, ulp = top - table[table.size() - 2].first;
    around(static_cast<float>(top + ulp / 2));
    around(static_cast<float>(top + ulp));
    for (float v : {1e6f, 3e38f, std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(), 1e-30f, 0.f})
      around(v);
    around(static_cast<float>(table[1].first / 2));  // half the smallest subnormal: ties to 0
    const size_t n = xs.size();
    for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
    for (size_t i = 0; i < xs.size(); ++i) {
      const float x = xs[i];
      EXPECT_EQ(static_cast<int>(f.encode(x)), static_cast<int>(reference_encode(table, x)))
          << "x = " << x << " (bits " << std::hex << bits(x) << ")";
    }
    // NaNs of any sign and payload become the canonical NaN 0x7f.
    for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu})
      EXPECT_EQ(f.encode(from_bits(nan)), 0x7f) << std::hex << nan;
    // Every value of the format encodes to itself (round trip), except NaNs and infinities.
    for (int c = 0; c < 256; ++c) {
      const float v = f.decode(static_cast<uint8_t>(c));
      if (std::isfinite(v)) {
        EXPECT_EQ(static_cast<int>(f.encode(v)), c) << "code " << c;
      }
    }
  }
}

TEST(Fp8Format, RandomFloatsMatchTheReference) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const auto table = finite_values(f);
    CounterRng rng(7, f.fmt == Fp8Format::E4M3 ? 1 : 2);
    int64_t mismatches = 0;
    for (uint64_t i = 0; i < 2000000; ++i) {
      // Half any bit pattern, half floats within the format's range (exponents -20 .. 17).
      const uint32_t r = static_cast<uint32_t>(rng.uniform(2 * i) * 4294967296.0);
      const float x = (i & 1) ? from_bits(r) : from_bits((r & 0x807fffffu) | ((107u + (r >> 23) % 38u) << 23));
      if (f.encode(x) != reference_encode(table, x) && ++mismatches <= 5)
        ADD_FAILURE() << "x = " << x << " (bits " << std::hex << bits(x) << "): got " << int(f.encode(x)) << " want "
                      << int(reference_encode(table, x));
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(Fp8Format, ClippedMeansBeyondTheLargestValuesRounding) {
  // e4m3: 464 = 448 + half an ulp rounds to 448 (ties to the even 0x7e): not clipped.
  EXPECT_FALSE(fp8_clipped(448.f, Fp8Format::E4M3));
  EXPECT_FALSE(fp8_clipped(464.f, Fp8Format::E4M3));
  EXPECT_TRUE(fp8_clipped(std::nextafter(464.f, 1e9f), Fp8Format::E4M3));
  EXPECT_TRUE(fp8_clipped(-1000.f, Fp8Format::E4M3));
  // e5m2: 61440 would round up (its tie's even neighbour is the next binade): clipped.
  EXPECT_FALSE(fp8_clipped(std::nextafter(61440.f, 0.f), Fp8Format::E5M2));
  EXPECT_TRUE(fp8_clipped(61440.f, Fp8Format::E5M2));
  EXPECT_TRUE(fp8_clipped(-std::numeric_limits<float>::infinity(), Fp8Format::E5M2));
  EXPECT_FALSE(fp8_clipped(std::numeric_limits<float>::quiet_NaN(), Fp8Format::E4M3));
}

TEST(Fp8Format, ScaleFromAmax) {
  EXPECT_EQ(fp8_scale_from_amax(2.f, 448.f, 1.f, 1.f), 224.f);
  EXPECT_EQ(fp8_scale_from_amax(2.f, 448.f, 0.25f, 1.f), 56.f);   // margin 2
  EXPECT_EQ(fp8_scale_from_amax(0.f, 448.f, 1.f, 3.f), 3.f);      // zero amax keeps the previous
  EXPECT_EQ(fp8_scale_from_amax(NAN, 448.f, 1.f, 3.f), 3.f);
  EXPECT_EQ(fp8_scale_from_amax(INFINITY, 448.f, 1.f, 3.f), 3.f);
  EXPECT_EQ(fp8_scale_from_amax(1e-40f, 448.f, 1.f, 1.f), std::numeric_limits<float>::max());  // overflow clamps
  EXPECT_EQ(fp8_scale_from_amax(3.f, 57344.f, 1.f, 1.f), 57344.f / 3.f);
}

// ---- the CPU backend's FP8 ops --------------------------------------------------------------------

class Fp8Ops : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
  Tensor t(Shape s, DType dt = DType::F32) { return ops->empty(std::move(s), dt, MemCategory::Workspace); }
  Tensor scalar(float v) {
    Tensor x = t({1});
    x.data<float>()[0] = v;
    return x;
  }
};

TEST_F(Fp8Ops, AmaxScaleAndQuantizeWithTranspose) {
  const int64_t R = 37, C = 48;
  Tensor x = test::random_tensor({R, C}, 11, 3.f);
  x.data<float>()[5 * C + 7] = -20.f;  // the amax
  Tensor amax = t({1});
  ops->fp8_amax(x, amax);
  EXPECT_EQ(amax.data<float>()[0], 20.f);
  Tensor scale = t({2}), record = scalar(7.f), none;
  ops->fp8_scale(amax, kFp8E4M3Max, 1, scale, record);
  EXPECT_EQ(scale.data<float>()[0], 448.f / 20.f / 2.f);
  EXPECT_EQ(scale.data<float>()[1], 1.f / scale.data<float>()[0]);
  EXPECT_EQ(record.data<float>()[0], 20.f);
  for (DType dt : {DType::F8E4M3, DType::F8E5M2}) {
    const Fp8Format fmt = dt == DType::F8E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
    Tensor q = t({R, C}, dt), qt = t({C, R}, dt), qt_only = t({C, R}, dt);
    Tensor step_amax = scalar(1.f), sat = scalar(5.f);
    // A scale that clips: 5 elements' |x s| beyond the rounding of the largest value.
    Tensor big = t({2});
    float* xs = x.data<float>();
    std::vector<float> mags(xs, xs + R * C);
    for (float& m : mags) m = std::fabs(m);
    std::sort(mags.begin(), mags.end());
    const float bound = fmt == Fp8Format::E4M3 ? 464.f : 61440.f;
    big.data<float>()[0] = 2 * bound / (mags[R * C - 6] + mags[R * C - 5]);  // between the 6th and 5th largest
    big.data<float>()[1] = 1.f / big.data<float>()[0];
    ops->fp8_quantize(x, big, q, qt, step_amax, sat);
    ops->fp8_quantize(x, big, none, qt_only, none, none);
    const uint8_t* pq = static_cast<const uint8_t*>(q.raw());
    const uint8_t* pt = static_cast<const uint8_t*>(qt.raw());
    const uint8_t* po = static_cast<const uint8_t*>(qt_only.raw());
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const uint8_t want = fp8_from_float(xs[r * C + c] * big.data<float>()[0], fmt);
        ASSERT_EQ(pq[r * C + c], want) << r << "," << c;
        ASSERT_EQ(pt[c * R + r], want) << r << "," << c;
        ASSERT_EQ(po[c * R + r], want) << r << "," << c;
      }
    EXPECT_EQ(step_amax.data<float>()[0], 20.f);  // max(1, 20)
    EXPECT_EQ(sat.data<float>()[0], 5.f + 5.f);   // += 5
  }
}

TEST_F(Fp8Ops, GemmMatchesTheDecodedProductInDouble) {
  for (auto [R, K, C] : {std::tuple<int64_t, int64_t, int64_t>{5, 16, 32}, {33, 64, 48}, {128, 96, 16}}) {
    for (auto [da, db] : {std::pair{DType::F8E4M3, DType::F8E4M3}, {DType::F8E5M2, DType::F8E4M3},
                          {DType::F8E4M3, DType::F8E5M2}}) {
      Tensor xa = test::random_tensor({R, K}, 20), xb = test::random_tensor({C, K}, 21, 0.05f);
      Tensor a = t({R, K}, da), b = t({C, K}, db), none;
      Tensor sa = t({2}), sb = t({2}), amax = t({1});
      ops->fp8_amax(xa, amax);
      ops->fp8_scale(amax, da == DType::F8E4M3 ? kFp8E4M3Max : kFp8E5M2Max, 0, sa, none);
      ops->fp8_amax(xb, amax);
      ops->fp8_scale(amax, db == DType::F8E4M3 ? kFp8E4M3Max : kFp8E5M2Max, 0, sb, none);
      ops->fp8_quantize(xa, sa, a, none, none, none);
      ops->fp8_quantize(xb, sb, b, none, none, none);
      const Fp8Format fa = da == DType::F8E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
      const Fp8Format fb = db == DType::F8E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
      Tensor bias = test::random_tensor({C}, 22);
      std::vector<double> want(R * C);
      const auto* pa = static_cast<const uint8_t*>(a.raw());
      const auto* pb = static_cast<const uint8_t*>(b.raw());
      const double alpha = static_cast<double>(sa.data<float>()[1] * sb.data<float>()[1]);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += double(fp8_to_float(pa[r * K + k], fa)) * fp8_to_float(pb[c * K + k], fb);
          want[r * C + c] = alpha * acc + bias.data<float>()[c];
        }
      Tensor out = t({R, C}), out_amax = scalar(0.f);
      ops->fp8_gemm(a, sa, b, sb, bias, false, out, out_amax);
      EXPECT_CLOSE(out, want, 1e-5, 1e-5);
      double m = 0;
      for (double v : want) m = std::max(m, std::fabs(v));
      EXPECT_NEAR(out_amax.data<float>()[0], m, 1e-5 * m);
      // Accumulating into f32 (a weight gradient): out += a b^T scaled.
      Tensor acc = test::random_tensor({R, C}, 23);
      std::vector<double> want_acc(R * C);
      for (int64_t i = 0; i < R * C; ++i) want_acc[i] = want[i] - bias.data<float>()[i % C] + acc.data<float>()[i];
      ops->fp8_gemm(a, sa, b, sb, none, true, acc, none);
      EXPECT_CLOSE(acc, want_acc, 1e-5, 1e-5);
    }
  }
}

TEST_F(Fp8Ops, GemmRefusesWhatCublasLtWould) {
  Tensor a = t({4, 24}, DType::F8E4M3), b = t({16, 24}, DType::F8E4M3), s = t({2}), out = t({4, 16}), none;
  EXPECT_THROW(ops->fp8_gemm(a, s, b, s, none, false, out, none), Error);  // K = 24
  Tensor a5 = t({4, 32}, DType::F8E5M2), b5 = t({16, 32}, DType::F8E5M2);
  EXPECT_THROW(ops->fp8_gemm(a5, s, b5, s, none, false, out, none), Error);  // both e5m2
}

TEST_F(Fp8Ops, BiasBackwardIsTheColumnSum) {
  Tensor dy = test::random_tensor({50, 20}, 30), db = test::random_tensor({20}, 31);
  std::vector<double> want(20);
  for (int c = 0; c < 20; ++c) {
    want[c] = db.data<float>()[c];
    for (int n = 0; n < 50; ++n) want[c] += dy.data<float>()[n * 20 + c];
  }
  ops->bias_backward(dy, db);
  EXPECT_CLOSE(db, want, 1e-5, 1e-5);
}

}  // namespace
}  // namespace tripod
