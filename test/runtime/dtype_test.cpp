// bfloat16 round-to-nearest-even (runtime/include/planrt/dtype.h) against a
// reference that picks the nearer of the two neighbouring bfloat16 values
// by arithmetic in double, ties to the even one: edge cases and a sweep
// over 2^32 / 4099 bit patterns of every sign and exponent. IEEE half
// against the compiler's _Float16 conversions (IEEE round-to-nearest-even
// in GCC's soft-float or F16C code), on every 2^32 / 257 bit pattern.
#include "planrt/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace planrt;

namespace {

/// The reference: truncation and the next bfloat16 up in magnitude, the
/// nearer wins, a tie goes to the even mantissa; from the largest finite
/// bfloat16's halfway point on, infinity.
uint16_t reference(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint16_t lo = uint16_t(bits >> 16);
  if (std::isnan(f) || std::isinf(f) || (bits & 0xffffu) == 0)
    return lo;
  uint16_t hi = uint16_t(lo + 1); // next in magnitude (may be infinity)
  double x = std::fabs(double(f));
  double a = std::fabs(double(float_from_bf16(lo)));
  // Past the largest finite bfloat16 the next value is 2^128, as if the
  // exponent went on (IEEE rounding: overflow past its halfway is infinity).
  double b = (hi & 0x7fffu) == 0x7f80u ? std::ldexp(1.0, 128)
                                       : std::fabs(double(float_from_bf16(hi)));
  if (x - a < b - x)
    return lo;
  if (x - a > b - x)
    return hi;
  return (lo & 1u) ? hi : lo;
}

TEST(Bf16, EdgeCases) {
  EXPECT_EQ(bf16_from_float(0.0f), 0x0000);
  EXPECT_EQ(bf16_from_float(-0.0f), 0x8000);
  EXPECT_EQ(bf16_from_float(1.0f), 0x3f80);
  EXPECT_EQ(bf16_from_float(-2.0f), 0xc000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1).
  EXPECT_EQ(bf16_from_float(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to even.
  EXPECT_EQ(bf16_from_float(1.0f + 3.0f / 256), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(bf16_from_float(std::nextafter(1.0f + 1.0f / 256, 2.0f)), 0x3f81);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_from_float(inf), 0x7f80);
  EXPECT_EQ(bf16_from_float(-inf), 0xff80);
  // The largest float rounds past the largest bfloat16: infinity.
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::max()), 0x7f80);
  // NaN stays NaN (quiet), sign kept, even one whose payload would round
  // into the infinity pattern.
  float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(float_from_bf16(bf16_from_float(nan))));
  uint32_t sig = 0xff800001u; // -NaN, payload only in the low bits
  float snan;
  std::memcpy(&snan, &sig, 4);
  uint16_t h = bf16_from_float(snan);
  EXPECT_TRUE(std::isnan(float_from_bf16(h)));
  EXPECT_EQ(h & 0x8000, 0x8000);
  // Subnormals round like everything else.
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(Bf16, MatchesTheReferenceOnASweep) {
  int64_t checked = 0;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 4099) {
    uint32_t bits = uint32_t(b);
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f))
      continue;
    ASSERT_EQ(bf16_from_float(f), reference(f))
        << "bits 0x" << std::hex << bits;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}

TEST(Bf16, RoundTripsEveryBf16) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    float f = float_from_bf16(uint16_t(h));
    if (std::isnan(f))
      continue;
    EXPECT_EQ(bf16_from_float(f), h);
  }
}

TEST(F16, EdgeCases) {
  EXPECT_EQ(f16_from_float(0.0f), 0x0000);
  EXPECT_EQ(f16_from_float(-0.0f), 0x8000);
  EXPECT_EQ(f16_from_float(1.0f), 0x3c00);
  EXPECT_EQ(f16_from_float(65504.0f), 0x7bff); // the largest half
  EXPECT_EQ(f16_from_float(65519.0f), 0x7bff); // below halfway to 2^16
  EXPECT_EQ(f16_from_float(65520.0f), 0x7c00); // halfway: to even = inf
  EXPECT_EQ(f16_from_float(std::ldexp(1.0f, -24)), 0x0001); // subnormal min
  EXPECT_EQ(f16_from_float(std::ldexp(1.0f, -25)), 0x0000); // tie to even 0
  EXPECT_EQ(f16_from_float(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f16_from_float(std::ldexp(3.0f, -25)), 0x0002); // tie to even 2
  EXPECT_EQ(f16_from_float(std::ldexp(1.0f, -14)), 0x0400); // normal min
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f16_from_float(-inf), 0xfc00);
  EXPECT_TRUE(std::isnan(float_from_f16(f16_from_float(std::nanf("")))));
  EXPECT_EQ(float_from_f16(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(float_from_f16(0xfbff), -65504.0f);
}

TEST(F16, MatchesFloat16OnASweep) {
  int64_t checked = 0;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 257) {
    uint32_t bits = uint32_t(b);
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f))
      continue;
    _Float16 h = (_Float16)f;
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(f16_from_float(f), want) << "bits 0x" << std::hex << bits;
    ++checked;
  }
  EXPECT_GT(checked, 10000000);
}

TEST(F16, WidensEveryHalfExactly) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    uint16_t bits = uint16_t(h);
    _Float16 ref;
    std::memcpy(&ref, &bits, 2);
    float f = float_from_f16(bits);
    if (std::isnan(float(ref))) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    EXPECT_EQ(f, float(ref)) << "half 0x" << std::hex << h;
    EXPECT_EQ(f16_from_float(f), bits);
  }
}

} // namespace
