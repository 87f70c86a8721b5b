// The 16-point random Hadamard transform (lib/numerics/hadamard.h, SPEC-NVFP4 §3): the sign mask, the
// orthogonality R·Rᵀ = I, BF16-representable outputs, bit-exact agreement with an exact integer
// reference rounded as specified (RN_bf16(RN_fp32(exact sum))), and linearity / norm sanity.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "numerics/bf16.h"
#include "numerics/hadamard.h"

namespace pl {
namespace {

// Row i of R (= R applied to the unit vector e_i, since c' = c · R).
void rht_matrix(uint16_t mask, float R[16][16]) {
  for (int i = 0; i < 16; ++i) {
    float e[16] = {};
    e[i] = 1.0f;
    num::rht16(e, R[i], mask);
  }
}

// Exact reference: inputs are BF16 values with exponents in [-24, 20], so every 0.25*s*H*x term is an
// integer multiple of 2^-33 below 2^23 and the 16-term sum is exact in int64. One RN to float (the
// int64 -> float conversion; the 2^-33 scaling is exact), then RN to BF16.
float ref_rht_out(const float in[16], int j, uint16_t mask) {
  int64_t acc = 0;
  for (int i = 0; i < 16; ++i) {
    const int64_t v = static_cast<int64_t>(std::ldexp(static_cast<double>(in[i]), 31));  // exact: x*0.25*2^33
    const bool neg = ((std::popcount(static_cast<unsigned>(i & j)) & 1) != 0) != (((mask >> i) & 1) != 0);
    acc += neg ? -v : v;
  }
  return num::round_bf16(std::ldexp(static_cast<float>(acc), -33));
}

float random_bf16(std::mt19937& rng, int min_exp, int max_exp) {
  const int e = min_exp + static_cast<int>(rng() % static_cast<unsigned>(max_exp - min_exp + 1));
  const float m = 1.0f + static_cast<float>(rng() % 128) / 128.0f;
  const float v = std::ldexp(m, e);
  return (rng() & 1) ? -v : v;
}

TEST(NumericsHadamard, SignMaskIsTeSignVector) {
  const int s[16] = {+1, +1, +1, -1, +1, -1, -1, -1, -1, -1, -1, +1, -1, +1, -1, -1};
  uint16_t mask = 0;
  for (int i = 0; i < 16; ++i)
    if (s[i] < 0) mask = static_cast<uint16_t>(mask | (1u << i));
  EXPECT_EQ(mask, num::kRhtSignMask);
  float R[16][16];
  rht_matrix(num::kRhtSignMask, R);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      const int h = (std::popcount(static_cast<unsigned>(i & j)) & 1) ? -1 : 1;
      EXPECT_EQ(R[i][j], 0.25f * static_cast<float>(s[i] * h)) << i << "," << j;
    }
}

TEST(NumericsHadamard, Orthogonal) {
  for (uint16_t mask : {num::kRhtSignMask, static_cast<uint16_t>(0)}) {
    float R[16][16];
    rht_matrix(mask, R);
    for (int a = 0; a < 16; ++a)
      for (int b = 0; b < 16; ++b) {
        double dot = 0;
        for (int k = 0; k < 16; ++k) dot += static_cast<double>(R[a][k]) * R[b][k];
        EXPECT_EQ(dot, a == b ? 1.0 : 0.0) << "mask " << mask << " (" << a << "," << b << ")";
      }
  }
}

TEST(NumericsHadamard, MatchesExactReferenceBitForBit) {
  std::mt19937 rng(2024);
  int64_t mismatches = 0, checked = 0;
  for (int t = 0; t < 60000; ++t) {
    float in[16], out[16];
    // Mix chunks of similar magnitude with outlier-heavy ones (wide exponent spread, where the FP32
    // rounding of the sum and the double-rounding subtleties matter).
    const bool wide = (t % 2) == 1;
    for (float& v : in) v = wide ? random_bf16(rng, -24, 20) : random_bf16(rng, -3, 3);
    if (t % 7 == 0) in[rng() % 16] = 0.0f;
    const uint16_t mask = (t % 3 == 0) ? static_cast<uint16_t>(0) : num::kRhtSignMask;
    num::rht16(in, out, mask);
    for (int j = 0; j < 16; ++j) {
      ASSERT_EQ(out[j], num::round_bf16(out[j]));  // BF16-representable
      const float ref = ref_rht_out(in, j, mask);
      if (num::float_bits(out[j]) != num::float_bits(ref)) ++mismatches;
      ++checked;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  // In place (out aliases in).
  float x[16], y[16];
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i) - 7.5f;
  num::rht16(x, y, num::kRhtSignMask);
  num::rht16(x, x, num::kRhtSignMask);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(x[i], y[i]);
}

TEST(NumericsHadamard, FloatRoundingBeforeBf16) {
  // A sum whose exact value lies just above a BF16 midpoint but rounds to the midpoint in FP32: the
  // specified order (FP32 first, then BF16 ties-to-even) rounds down, a direct BF16 rounding would
  // round up. Chunk: x0 = 4 * (1 + 2^-8) (exact sum 1 + 2^-8 for j with H[0][j] = +1) plus a tiny
  // term 4 * 2^-30 that FP32 drops (below half an FP32 ulp of 1).
  float in[16] = {};
  in[0] = 4.0f * (1.0f + 0x1p-8f);
  in[1] = 0x1p-28f;  // 0.25 * in[1] = 2^-30
  float out[16];
  num::rht16(in, out, 0);
  EXPECT_EQ(out[0], 1.0f);            // RN_fp32 -> 1 + 2^-8 exactly (a BF16 tie) -> even: 1.0
  EXPECT_EQ(out[1], 1.0f);            // column 1: H[1][1] = -1: 1 + 2^-8 - 2^-30 -> FP32 1 + 2^-8 -> 1.0
  EXPECT_EQ(ref_rht_out(in, 0, 0), 1.0f);
}

TEST(NumericsHadamard, LinearityAndNorm) {
  std::mt19937 rng(5);
  for (int t = 0; t < 2000; ++t) {
    float x[16], y[16], x4[16], y4[16];
    for (float& v : x) v = random_bf16(rng, -4, 4);
    num::rht16(x, y, num::kRhtSignMask);
    for (int i = 0; i < 16; ++i) x4[i] = 4.0f * x[i];  // scaling by a power of two commutes exactly
    num::rht16(x4, y4, num::kRhtSignMask);
    double nx = 0, ny = 0;
    for (int i = 0; i < 16; ++i) {
      ASSERT_EQ(y4[i], 4.0f * y[i]);
      nx += static_cast<double>(x[i]) * x[i];
      ny += static_cast<double>(y[i]) * y[i];
    }
    ASSERT_NEAR(std::sqrt(ny), std::sqrt(nx), std::sqrt(nx) * 0x1p-8);  // orthogonal up to BF16 rounding
  }
  // Sign flip commutes; NaN and Inf propagate.
  float x[16], y[16], xn[16], yn[16];
  for (int i = 0; i < 16; ++i) {
    x[i] = static_cast<float>(i * i) * 0.125f;
    xn[i] = -x[i];
  }
  num::rht16(x, y, num::kRhtSignMask);
  num::rht16(xn, yn, num::kRhtSignMask);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(yn[i], -y[i]);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  num::rht16(x, y, num::kRhtSignMask);
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isnan(y[i]));
}

}  // namespace
}  // namespace pl
