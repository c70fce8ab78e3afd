// test_half.cc — half.h's float16 and bfloat16 conversions against the
// definition: every encoding decodes and re-encodes to itself, and rounding
// picks the nearest value, ties to even (part of the test_kernels binary).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/half.h"

namespace shoal::kernels {
namespace {

// The float16 / bfloat16 neighbours of the encoding of x must not be closer to
// x, and on a tie the chosen one is even.
template <typename Dec>
void check_nearest(float x, uint16_t h, Dec decode, uint16_t inf_bits) {
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(decode(h))) << x;
    return;
  }
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  EXPECT_EQ(h & 0x8000, sign) << x;
  const double ax = std::fabs(static_cast<double>(x));
  const uint16_t mag = h & 0x7FFF;
  EXPECT_LE(mag, inf_bits) << x;
  auto value = [&](uint16_t m) -> double {
    // Beyond the largest finite value, rounding goes to infinity at the next "step".
    if (m >= inf_bits) {
      const double last = std::fabs(static_cast<double>(decode(inf_bits - 1)));
      const double step = last - std::fabs(static_cast<double>(decode(inf_bits - 2)));
      return last + step;
    }
    return std::fabs(static_cast<double>(decode(m)));
  };
  const double err = std::fabs(value(mag) - ax);
  if (mag > 0) {
    const double below = std::fabs(value(mag - 1) - ax);
    EXPECT_TRUE(err < below || (err == below && (mag & 1) == 0)) << x << " -> " << h;
  }
  if (mag < inf_bits) {
    const double above = std::fabs(value(mag + 1) - ax);
    EXPECT_TRUE(err < above || (err == above && (mag & 1) == 0)) << x << " -> " << h;
  }
}

// Every one of the 65536 encodings decodes and encodes back to itself; a NaN
// (above `inf_bits`) comes back quieted: equal outside the `quiet` mask.
template <typename Dec, typename Enc>
void check_round_trips(Dec decode, Enc encode, uint16_t inf_bits, uint16_t quiet) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = decode(h);
    if ((h & 0x7FFF) > inf_bits) {
      EXPECT_TRUE(std::isnan(f)) << i;
      EXPECT_EQ(encode(f) & ~quiet & 0xFFFF, h & ~quiet & 0xFFFF) << i;
    } else {
      ASSERT_EQ(encode(f), h) << i;
    }
  }
}

TEST(Half, Float16RoundTripsAndRoundsToNearestEven) {
  check_round_trips(half_to_float, float_to_half, 0x7C00, 0x0200);  // payload kept, quieted
  EXPECT_EQ(half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(float_to_half(65519.99f), 0x7BFF);
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);            // tie to even (0)
  EXPECT_EQ(float_to_half(0x1.8p-24f), 0x0002);          // 1.5 units: tie to even (2)
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f), 0x3C00);     // tie to even
  EXPECT_EQ(float_to_half(1.0f + 0x1.8p-10f), 0x3C02);   // tie up to even
  std::mt19937 rng(5);
  for (int k = 0; k < 200000; ++k) {
    // Random bits, biased toward the float16 exponent range.
    uint32_t bits = static_cast<uint32_t>(rng());
    if (k % 2) bits = (bits & 0x807FFFFF) | ((97u + rng() % 50) << 23);
    const float x = bits_float(bits);
    check_nearest(x, float_to_half(x), half_to_float, 0x7C00);
  }
}

TEST(Half, BFloat16RoundTripsAndRoundsToNearestEven) {
  check_round_trips(bfloat16_to_float, float_to_bfloat16, 0x7F80, 0x0040);
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1p-8f), 0x3F80);    // tie to even
  EXPECT_EQ(float_to_bfloat16(1.0f + 0x1.8p-7f), 0x3F82);  // tie up to even
  EXPECT_EQ(float_to_bfloat16(bits_float(0x7F800001)) & 0x7FC0, 0x7FC0);  // NaN stays NaN
  std::mt19937 rng(6);
  for (int k = 0; k < 200000; ++k) {
    const float x = bits_float(static_cast<uint32_t>(rng()));
    check_nearest(x, float_to_bfloat16(x), bfloat16_to_float, 0x7F80);
  }
}

}  // namespace
}  // namespace shoal::kernels
