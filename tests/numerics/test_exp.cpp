// num::exp_f32 (lib/numerics/exp.h) against the host libm's expf (glibc: correctly rounded in practice):
// a strided sweep over every float bit pattern of the range the ops use, the special values, and the
// ends of the range (overflow, the subnormal results, underflow to zero).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "numerics/exp.h"

namespace pl {
namespace {

// The distance in ulps between two finite floats or infinities of any sign (bit patterns made monotonic).
int64_t ulp_distance(float a, float b) {
  const auto ordered = [](float f) {
    const uint32_t u = num::float_bits(f);
    return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7FFFFFFFu) : static_cast<int64_t>(u);
  };
  return std::llabs(ordered(a) - ordered(b));
}

// Every 101st bit pattern (an odd stride: the low mantissa bits take every value) of the negative floats down
// to -104 (cross-entropy's exp(x - max) and silu's exp(-g) for g > 0) and of the positive floats up to 89
// (silu's exp(-g) for g < 0). The whole range, measured once: at most 1 ulp (the header's comment).
TEST(NumericsExp, WithinOneUlpOfLibmOverTheWholeRange) {
  int64_t worst = 0, differing = 0, checked = 0;
  float worst_x = 0.0f;
  const auto check = [&](uint32_t u) {
    const float x = num::bits_float(u);
    const int64_t d = ulp_distance(num::exp_f32(x), std::exp(x));
    ++checked;
    differing += d != 0;
    if (d > worst) worst = d, worst_x = x;
  };
  const uint32_t neg_end = num::float_bits(-104.0f), pos_end = num::float_bits(89.0f);
  for (uint32_t u = 0x80000000u; u <= neg_end; u += 101) check(u);
  for (uint32_t u = 0; u <= pos_end; u += 101) check(u);
  EXPECT_LE(worst, 1) << "at x = " << worst_x;
  EXPECT_GT(checked, 20'000'000);
  // Most results are the correctly rounded ones (99.2% over the whole range); a broken polynomial or
  // reduction would show up here before it reaches 2 ulp.
  EXPECT_LT(static_cast<double>(differing) / static_cast<double>(checked), 0.02);
}

TEST(NumericsExp, SpecialValuesAndRangeEnds) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(num::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(num::exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(num::exp_f32(-inf), 0.0f);
  EXPECT_EQ(num::exp_f32(inf), inf);
  EXPECT_TRUE(std::isnan(num::exp_f32(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(num::exp_f32(88.8f), inf);      // past FLT_MAX = exp(88.7228...)
  EXPECT_EQ(num::exp_f32(1000.0f), inf);    // clamped
  EXPECT_EQ(num::exp_f32(-104.0f), 0.0f);   // below half the smallest subnormal
  EXPECT_EQ(num::exp_f32(-1000.0f), 0.0f);  // clamped
  // Subnormal results (x in (-103.97, -87.34)) are rounded once, as libm's.
  for (float x : {-87.5f, -95.25f, -100.0f, -103.0f, -103.9f}) {
    EXPECT_LE(ulp_distance(num::exp_f32(x), std::exp(x)), 1) << x;
    EXPECT_GT(num::exp_f32(x), 0.0f) << x;
    EXPECT_LT(num::exp_f32(x), std::numeric_limits<float>::min()) << x;
  }
  // The largest finite result.
  EXPECT_LE(ulp_distance(num::exp_f32(88.72f), std::exp(88.72f)), 1);
}

}  // namespace
}  // namespace pl
