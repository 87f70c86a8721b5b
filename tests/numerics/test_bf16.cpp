// BF16 conversion: against an independent reference (nearest of the two neighbouring BF16 values,
// decided in double, ties to the even one) and, when the CUDA headers are present, against
// cuda_bf16.h's own host conversion, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "numerics/bf16.h"

#if defined(PL_HAVE_CUDA_HEADERS)
#include <cuda_bf16.h>
#endif

namespace pl {
namespace {

uint16_t reference_bf16(float x) {
  if (std::isnan(x)) return 0x7FFF;
  const uint32_t u = num::float_bits(x);
  const uint16_t down = static_cast<uint16_t>(u >> 16);  // truncation toward zero (same sign)
  if ((u & 0xFFFFu) == 0) return down;
  const uint16_t up = static_cast<uint16_t>(down + 1);   // next BF16 away from zero (may be Inf)
  const double dx = std::abs(static_cast<double>(x));
  const double dd = std::abs(static_cast<double>(num::bf16_bits_to_float(down)));
  const double du = std::abs(static_cast<double>(num::bf16_bits_to_float(up)));
  // The upper neighbour of the largest finite BF16 is Inf; the midpoint is then max + half an ulp.
  const double du_eff = std::isinf(du) ? dd + (dd - std::abs(static_cast<double>(num::bf16_bits_to_float(
                                                          static_cast<uint16_t>(down - 1))))) : du;
  const double below = dx - dd, above = du_eff - dx;
  if (below < above) return down;
  if (above < below) return up;
  return (down & 1u) ? up : down;
}

TEST(NumericsBf16, RoundingEdges) {
  EXPECT_EQ(num::float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(num::float_to_bf16_bits(1.00390625f), 0x3F80);   // tie -> even (down)
  EXPECT_EQ(num::float_to_bf16_bits(1.01171875f), 0x3F82);   // tie -> even (up)
  EXPECT_EQ(num::float_to_bf16_bits(1.0f + 0x1p-8f + 1e-7f), 0x3F81);
  EXPECT_EQ(num::float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(num::float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(num::float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(num::float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(num::float_to_bf16_bits(-std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(num::float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // overflows to Inf
  EXPECT_EQ(num::float_to_bf16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(num::float_to_bf16_bits(0x1p-133f), 0x0001);      // the smallest bf16 subnormal
  EXPECT_EQ(num::float_to_bf16_bits(0x1p-134f), 0x0000);      // half of it: a tie, to even (zero)
  EXPECT_EQ(num::float_to_bf16_bits(0x1.8p-134f), 0x0001);    // above half
  EXPECT_EQ(num::round_bf16(3.14159265f), 3.140625f);
}

TEST(NumericsBf16, MatchesIndependentReferenceOnSampledBitPatterns) {
  int64_t checked = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 251) {
    const float x = num::bits_float(static_cast<uint32_t>(u));
    ASSERT_EQ(num::float_to_bf16_bits(x), reference_bf16(x)) << std::hex << "bits 0x" << u;
    ++checked;
  }
  // Every pattern around the rounding boundary of one binade (low 16 bits all values).
  for (uint32_t lo = 0; lo <= 0xFFFF; ++lo)
    for (uint32_t hi : {0x3F80u, 0x3F81u, 0x7F7Fu, 0x0000u, 0x8001u}) {
      const float x = num::bits_float((hi << 16) | lo);
      ASSERT_EQ(num::float_to_bf16_bits(x), reference_bf16(x)) << std::hex << ((hi << 16) | lo);
    }
  EXPECT_GT(checked, 17000000);
}

#if defined(PL_HAVE_CUDA_HEADERS)
TEST(NumericsBf16, BitExactWithCudaBf16HostConversion) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 509) {
    const float x = num::bits_float(static_cast<uint32_t>(u));
    const __nv_bfloat16 c = __float2bfloat16_rn(x);
    uint16_t cb;
    std::memcpy(&cb, &c, 2);
    const uint16_t ours = num::float_to_bf16_bits(x);
    if (std::isnan(x)) {
      ASSERT_EQ(ours, 0x7FFF);
      ASSERT_TRUE((cb & 0x7F80) == 0x7F80 && (cb & 0x7F) != 0) << "cuda result not NaN";
    } else {
      ASSERT_EQ(ours, cb) << std::hex << "bits 0x" << u;
    }
    const float back = __bfloat162float(c);
    ASSERT_EQ(num::float_bits(num::bf16_bits_to_float(cb)), num::float_bits(back));
  }
}
#else
TEST(NumericsBf16, BitExactWithCudaBf16HostConversion) {
  GTEST_SKIP() << "CUDA headers not available in this build (configure with nvcc present)";
}
#endif

}  // namespace
}  // namespace pl
