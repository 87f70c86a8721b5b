// FP4 E2M1 (lib/numerics/fp4.h): RN conversion against an independent nearest-on-the-grid reference
// and against cuda_fp4.hpp's host conversion bit for bit (when present); the decode table; TE's
// portable stochastic-rounding rule: exact unbiasedness over all 256 random bytes, neighbours only,
// saturation, NaN, and a lower RMSE of the mean than RN (as TE's test_nvfp4_sr_quantize.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "numerics/fp4.h"
#include "numerics/philox.h"

#if defined(PL_HAVE_CUDA_HEADERS)
#include <cuda_fp4.h>
#endif

namespace pl {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const double kGrid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

// Independent model of cvt.rn.satfinite.e2m1: nearest grid value, ties to the even code, |x| >= 6 -> 6,
// NaN -> +6, sign kept.
uint8_t ref_e2m1(float x) {
  if (std::isnan(x)) return 0x7;
  const double a = std::fabs(static_cast<double>(x));
  const uint8_t s = std::signbit(x) ? 0x8 : 0;
  if (a >= 6) return static_cast<uint8_t>(s | 7);
  int lo = 0;
  while (kGrid[lo + 1] <= a) ++lo;
  const double dl = a - kGrid[lo], dh = kGrid[lo + 1] - a;
  const int pick = dl < dh ? lo : (dh < dl ? lo + 1 : ((lo & 1) ? lo + 1 : lo));
  return static_cast<uint8_t>(s | pick);
}

TEST(NumericsFp4, DecodeTableAndRoundTrip) {
  for (int c = 0; c < 16; ++c) {
    const float f = num::e2m1_to_float(static_cast<uint8_t>(c));
    const double ref = (c & 8) ? -kGrid[c & 7] : kGrid[c & 7];
    EXPECT_EQ(static_cast<double>(f), ref) << c;
    EXPECT_EQ(std::signbit(f), (c & 8) != 0) << c;  // code 8 is -0
    EXPECT_EQ(num::float_to_e2m1(f), c) << c;
    EXPECT_EQ(num::e2m1_to_float(static_cast<uint8_t>(c | 0xF0)), f) << c;  // high nibble ignored
  }
}

TEST(NumericsFp4, RoundToNearestEvenEdges) {
  const struct {
    float x;
    uint8_t code;
  } cases[] = {{0.25f, 0},  {0.26f, 1},   {0.75f, 2},    {1.25f, 2},  {1.75f, 4}, {2.5f, 4},
               {3.5f, 6},   {5.0f, 6},    {5.01f, 7},    {6.0f, 7},   {7.0f, 7},  {1e30f, 7},
               {kInf, 7},   {-kInf, 15},  {-7.0f, 15},   {-0.0f, 8},  {-0.1f, 8}, {-0.25f, 8},
               {0.0f, 0},   {-0.26f, 9},  {-2.5f, 12},   {1e-40f, 0}, {-1e-40f, 8}};
  for (const auto& c : cases) EXPECT_EQ(num::float_to_e2m1(c.x), c.code) << c.x;
  EXPECT_EQ(num::float_to_e2m1(kNaN), 0x7);  // NaN -> +6 whatever the sign
  EXPECT_EQ(num::float_to_e2m1(-kNaN), 0x7);
}

TEST(NumericsFp4, MatchesGridReferenceOnSampledBitPatterns) {
  int64_t n = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 1021) {
    const float x = num::bits_float(static_cast<uint32_t>(u));
    ASSERT_EQ(num::float_to_e2m1(x), ref_e2m1(x)) << std::hex << u;
    ++n;
  }
  // Densely over [2^-3, 2^4) where every rounding boundary lies.
  for (uint32_t u = 0x3E000000u; u < 0x41800000u; u += 7) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e2m1(x), ref_e2m1(x)) << std::hex << u;
    ASSERT_EQ(num::float_to_e2m1(-x), ref_e2m1(-x)) << std::hex << u;
  }
  EXPECT_GT(n, 4000000);
}

#if defined(PL_HAVE_CUDA_HEADERS)
uint8_t cuda_e2m1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); }

TEST(NumericsFp4, BitExactWithCudaHostConversion) {
  int64_t n = 0;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 263) {
    const float x = num::bits_float(static_cast<uint32_t>(u));
    ASSERT_EQ(num::float_to_e2m1(x), cuda_e2m1(x)) << std::hex << "bits 0x" << u;
    ++n;
  }
  EXPECT_GT(n, 16000000);
  // Every pattern of the binades holding a rounding boundary: 2^-2 (0.25 -> 0 tie) up to 2^2 (4..8:
  // 5 -> 4 tie, the max 6 and saturation), and 2^3.
  for (uint32_t u = 0x3E800000u; u < 0x41800000u; ++u) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e2m1(x), cuda_e2m1(x)) << std::hex << u;
  }
  for (int c = 0; c < 16; ++c) {
    __nv_fp4_e2m1 v;
    v.__x = static_cast<__nv_fp4_storage_t>(c);
    EXPECT_EQ(num::float_bits(num::e2m1_to_float(static_cast<uint8_t>(c))), num::float_bits(static_cast<float>(v)))
        << c;
  }
}
#else
TEST(NumericsFp4, BitExactWithCudaHostConversion) {
  GTEST_SKIP() << "CUDA headers not available in this build (configure with nvcc present)";
}
#endif

// ---- stochastic rounding ---------------------------------------------------------------------
double step_of(double a) { return a < 2 ? 0.5 : (a < 4 ? 1.0 : 2.0); }

TEST(NumericsFp4, StochasticRoundingIsExactlyUnbiasedOverAllRandomBytes) {
  // Every x on the step/256 grid of [0, 6): the mean of the 256 results equals x exactly, and each
  // result is one of x's two grid neighbours.
  std::vector<double> xs;
  for (int k = 0; k < 1024; ++k) xs.push_back(k / 512.0);      // [0, 2): step 0.5
  for (int k = 0; k < 512; ++k) xs.push_back(2 + k / 256.0);   // [2, 4): step 1
  for (int k = 0; k < 256; ++k) xs.push_back(4 + k / 128.0);   // [4, 6): step 2
  for (const double a : xs) {
    for (int sgn = 0; sgn < 2; ++sgn) {
      const float x = static_cast<float>(sgn ? -a : a);
      double sum = 0;
      const double lo = std::floor(a / step_of(a)) * step_of(a), hi = lo + step_of(a);
      for (int r = 0; r < 256; ++r) {
        const uint8_t c = num::float_to_e2m1_sr(x, static_cast<uint8_t>(r));
        const double v = std::fabs(static_cast<double>(num::e2m1_to_float(c)));
        ASSERT_TRUE(v == lo || v == hi) << x << " r=" << r;
        ASSERT_EQ((c & 8) != 0, sgn == 1) << x;  // sign kept (zero results too)
        sum += num::e2m1_to_float(c);
      }
      ASSERT_EQ(sum / 256.0, static_cast<double>(x)) << x;
    }
  }
}

TEST(NumericsFp4, StochasticRoundingEdges) {
  for (int r = 0; r < 256; ++r) {
    const uint8_t rb = static_cast<uint8_t>(r);
    EXPECT_EQ(num::float_to_e2m1_sr(6.0f, rb), 7);
    EXPECT_EQ(num::float_to_e2m1_sr(5.999f, rb) & 7, 5.999f + r / 256.0f * 2 >= 6 ? 7 : 6);
    EXPECT_EQ(num::float_to_e2m1_sr(100.0f, rb), 7);
    EXPECT_EQ(num::float_to_e2m1_sr(kInf, rb), 7);
    EXPECT_EQ(num::float_to_e2m1_sr(-kInf, rb), 15);
    EXPECT_EQ(num::float_to_e2m1_sr(-1e30f, rb), 15);
    EXPECT_EQ(num::float_to_e2m1_sr(kNaN, rb), 7);   // NaN -> +6
    EXPECT_EQ(num::float_to_e2m1_sr(-kNaN, rb), 7);
    EXPECT_EQ(num::float_to_e2m1_sr(0.0f, rb), 0);
    EXPECT_EQ(num::float_to_e2m1_sr(-0.0f, rb), 8);  // -0 keeps its sign, as the RN path
    for (int c = 0; c < 16; ++c)  // grid values are reproduced for every random byte
      EXPECT_EQ(num::float_to_e2m1_sr(num::e2m1_to_float(static_cast<uint8_t>(c)), rb), c) << c;
  }
  // rbits 0 truncates toward zero; rbits 255 rounds up anything off the 1/256-step grid.
  EXPECT_EQ(num::float_to_e2m1_sr(1.49f, 0), 2);
  EXPECT_EQ(num::float_to_e2m1_sr(-2.9f, 0), 12);
  EXPECT_EQ(num::float_to_e2m1_sr(1.01f, 255), 3);
  EXPECT_EQ(num::float_to_e2m1_sr(4.1f, 255), 7);
  // Threshold: 1.25 rounds up to 1.5 iff u >= 0.5, i.e. rbits >= 128.
  EXPECT_EQ(num::float_to_e2m1_sr(1.25f, 127), 2);
  EXPECT_EQ(num::float_to_e2m1_sr(1.25f, 128), 3);
  // Crossing into the next binade: 1.9 with u >= 0.2 -> t >= 2 -> 2.
  EXPECT_EQ(num::float_to_e2m1_sr(1.9f, 255), 4);
  // Monotone in the random byte, and the same byte always gives the same code.
  std::mt19937 rng(1);
  for (int i = 0; i < 10000; ++i) {
    const float x = std::uniform_real_distribution<float>(-7.0f, 7.0f)(rng);
    uint8_t prev = num::float_to_e2m1_sr(x, 0);
    for (int r = 1; r < 256; ++r) {
      const uint8_t c = num::float_to_e2m1_sr(x, static_cast<uint8_t>(r));
      ASSERT_GE(std::fabs(num::e2m1_to_float(c)), std::fabs(num::e2m1_to_float(prev))) << x;
      ASSERT_EQ(c, num::float_to_e2m1_sr(x, static_cast<uint8_t>(r)));
      prev = c;
    }
  }
}

TEST(NumericsFp4, StochasticRoundingMeanBeatsRoundToNearest) {
  // TE's SR test idea: the mean of many SR quantizations is closer to x than the RN quantization.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const int n = 8192, draws = 64;
  double err_rn = 0, err_sr = 0, bias_sr = 0;
  for (int i = 0; i < n; ++i) {
    float x = nd(rng);
    x = std::fmax(-6.0f, std::fmin(6.0f, x));
    const double rn = num::e2m1_to_float(num::float_to_e2m1(x));
    double mean = 0;
    for (int d = 0; d < draws; ++d)
      mean += num::e2m1_to_float(num::float_to_e2m1_sr(x, num::sr_random_byte(99, 3, static_cast<uint64_t>(d),
                                                                              static_cast<uint64_t>(i))));
    mean /= draws;
    err_rn += (rn - x) * (rn - x);
    err_sr += (mean - x) * (mean - x);
    bias_sr += mean - x;
  }
  const double rmse_rn = std::sqrt(err_rn / n), rmse_sr = std::sqrt(err_sr / n);
  EXPECT_LT(rmse_sr, 0.5 * rmse_rn) << "rmse sr " << rmse_sr << " rn " << rmse_rn;
  EXPECT_LT(std::fabs(bias_sr / n), 0.01);
}

}  // namespace
}  // namespace pl
