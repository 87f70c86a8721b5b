// FP8 conversions (E4M3, E5M2, UE8M0) and the FP8 / MXFP8 recipe scale math (lib/numerics/fp8.h):
// against an independent nearest-on-the-grid reference built from the decode tables, against the CUDA
// headers' host conversions (cuda_fp8.hpp) bit for bit when present, and on hand-checked edge cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "numerics/fp8.h"

#if defined(PL_HAVE_CUDA_HEADERS)
#include <cuda_fp8.h>
#endif

namespace pl {
namespace {

constexpr float kFp8Inf = std::numeric_limits<float>::infinity();
constexpr float kFp8NaN = std::numeric_limits<float>::quiet_NaN();

// Value of an E4M3 / E5M2 code from the format definition (independent of fp8.h), in double.
double e4m3_value(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if ((c & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}
double e5m2_value(int c) {
  const int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : (s ? -HUGE_VAL : HUGE_VAL);
  const double mag = e == 0 ? std::ldexp(m, -16) : std::ldexp(1.0 + m / 4.0, e - 15);
  return s ? -mag : mag;
}

// Nearest code on a grid of non-negative finite values (sorted, with their codes), ties to the even
// code, saturating at the largest; sign from x; NaN -> nan_code. An independent model of
// cvt.rn.satfinite.
struct Grid {
  std::vector<double> v;
  std::vector<uint8_t> code;
  uint8_t nan_code;
  uint8_t sign_bit;
  uint8_t round(float x) const {
    if (std::isnan(x)) return nan_code;
    const double a = std::fabs(static_cast<double>(x));
    const uint8_t s = std::signbit(x) ? sign_bit : 0;
    if (a >= v.back()) return static_cast<uint8_t>(s | code.back());
    const size_t hi = static_cast<size_t>(std::upper_bound(v.begin(), v.end(), a) - v.begin());
    const size_t lo = hi - 1;
    const double dl = a - v[lo], dh = v[hi] - a;
    size_t pick = dl < dh ? lo : (dh < dl ? hi : ((code[lo] & 1) ? hi : lo));
    return static_cast<uint8_t>(s | code[pick]);
  }
};

Grid make_grid(double (*value)(int), int max_code, uint8_t nan_code) {
  Grid g;
  for (int c = 0; c <= max_code; ++c) {
    g.v.push_back(value(c));
    g.code.push_back(static_cast<uint8_t>(c));
  }
  g.nan_code = nan_code;
  g.sign_bit = 0x80;
  return g;
}

// Strided sweep over all 2^32 float bit patterns (both signs, NaN, Inf, subnormals).
template <class F>
void sweep(uint64_t stride, F&& f) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += stride) f(static_cast<uint32_t>(u));
}
// Every positive pattern of the binades [2^lo_exp, 2^(hi_exp+1)) (unbiased exponents); the conversions
// treat the sign separately (checked by the sweeps).
template <class F>
void binades(int lo_exp, int hi_exp, F&& f) {
  for (int e = lo_exp; e <= hi_exp; ++e) {
    const uint32_t base = static_cast<uint32_t>(e + 127) << 23;
    for (uint32_t m = 0; m < (1u << 23); ++m) f(base | m);
  }
}

// ---- E4M3 ------------------------------------------------------------------------------------
TEST(NumericsFp8, E4M3DecodeTableAndRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    const float f = num::e4m3_to_float(static_cast<uint8_t>(c));
    const double ref = e4m3_value(c);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), ref) << c;
    EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << c;  // 0x80 is -0
    EXPECT_EQ(num::float_to_e4m3(f), c) << c;           // every finite code round-trips
  }
  EXPECT_EQ(num::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(num::e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(num::e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(num::e4m3_to_float(0x74), 192.0f);
}

TEST(NumericsFp8, E4M3Edges) {
  EXPECT_EQ(num::float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(num::float_to_e4m3(464.0f), 0x7E);  // max + half ulp
  EXPECT_EQ(num::float_to_e4m3(465.0f), 0x7E);  // satfinite
  EXPECT_EQ(num::float_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(num::float_to_e4m3(kFp8Inf), 0x7E);
  EXPECT_EQ(num::float_to_e4m3(-kFp8Inf), 0xFE);
  EXPECT_EQ(num::float_to_e4m3(-500.0f), 0xFE);
  EXPECT_EQ(num::float_to_e4m3(kFp8NaN), 0x7F);
  EXPECT_EQ(num::float_to_e4m3(-kFp8NaN), 0x7F);  // NaN sign dropped (CUDA host path)
  EXPECT_EQ(num::float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(num::float_to_e4m3(-0.0f), 0x80);  // sign of zero kept
  EXPECT_EQ(num::float_to_e4m3(-1e-10f), 0x80);
  EXPECT_EQ(num::float_to_e4m3(0x1p-10f), 0x00);      // exactly half the min subnormal: tie to even (0)
  EXPECT_EQ(num::float_to_e4m3(0x1.000002p-10f), 0x01);
  EXPECT_EQ(num::float_to_e4m3(0x1.8p-10f), 0x01);
  EXPECT_EQ(num::float_to_e4m3(0x1.8p-9f), 0x02);     // 1.5 quanta: tie to even (2)
  EXPECT_EQ(num::float_to_e4m3(0x1.4p-8f), 0x02);     // 2.5 quanta: tie to even (2)
  EXPECT_EQ(num::float_to_e4m3(0x1.ep-7f), 0x08);     // 7.5 quanta -> 8 = min normal 2^-6
  EXPECT_EQ(num::float_to_e4m3(193.0f), 0x74);        // SPEC-NVFP4 §1.7: 193 -> 192
  EXPECT_EQ(num::float_to_e4m3(1.0625f), 0x38);       // tie between 1 and 1.125 -> 1
  EXPECT_EQ(num::float_to_e4m3(1.1875f), 0x3A);       // tie between 1.125 and 1.25 -> 1.25
  EXPECT_EQ(num::float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(NumericsFp8, E4M3MatchesGridReferenceOnSampledBitPatterns) {
  const Grid g = make_grid(e4m3_value, 0x7E, 0x7F);
  int64_t n = 0;
  sweep(4093, [&](uint32_t u) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e4m3(x), g.round(x)) << std::hex << u;
    ++n;
  });
  // The subnormal / min-normal and the saturation boundary, sampled densely.
  for (uint32_t u = 0x3A000000u; u < 0x3D000000u; u += 61) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e4m3(x), g.round(x)) << std::hex << u;
  }
  for (uint32_t u = 0x43800000u; u < 0x44800000u; u += 61) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e4m3(x), g.round(x)) << std::hex << u;
  }
  EXPECT_GT(n, 1000000);
}

// ---- E5M2 ------------------------------------------------------------------------------------
TEST(NumericsFp8, E5M2DecodeTableAndRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    const float f = num::e5m2_to_float(static_cast<uint8_t>(c));
    const double ref = e5m2_value(c);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), ref) << c;
    EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << c;
    if (!std::isinf(ref)) {
      EXPECT_EQ(num::float_to_e5m2(f), c) << c;
    }
  }
  EXPECT_EQ(num::e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(num::e5m2_to_float(0x7C), kFp8Inf);
  EXPECT_EQ(num::e5m2_to_float(0xFC), -kFp8Inf);
  EXPECT_EQ(num::e5m2_to_float(0x01), 0x1p-16f);
}

TEST(NumericsFp8, E5M2Edges) {
  EXPECT_EQ(num::float_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(num::float_to_e5m2(61440.0f), 0x7B);  // max + half ulp
  EXPECT_EQ(num::float_to_e5m2(1e6f), 0x7B);      // satfinite
  EXPECT_EQ(num::float_to_e5m2(kFp8Inf), 0x7B);
  EXPECT_EQ(num::float_to_e5m2(-kFp8Inf), 0xFB);
  EXPECT_EQ(num::float_to_e5m2(kFp8NaN), 0x7F);
  EXPECT_EQ(num::float_to_e5m2(-kFp8NaN), 0x7F);
  EXPECT_EQ(num::float_to_e5m2(-0.0f), 0x80);
  EXPECT_EQ(num::float_to_e5m2(0x1p-17f), 0x00);  // half the min subnormal: tie to even
  EXPECT_EQ(num::float_to_e5m2(0x1.8p-16f), 0x02);
  EXPECT_EQ(num::float_to_e5m2(1.125f), 0x3C);     // tie between 1 and 1.25 -> 1
  EXPECT_EQ(num::float_to_e5m2(1.375f), 0x3E);     // tie between 1.25 and 1.5 -> 1.5
}

TEST(NumericsFp8, E5M2MatchesGridReferenceOnSampledBitPatterns) {
  const Grid g = make_grid(e5m2_value, 0x7B, 0x7F);
  sweep(4093, [&](uint32_t u) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e5m2(x), g.round(x)) << std::hex << u;
  });
  for (uint32_t u = 0x37000000u; u < 0x38C00000u; u += 61) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e5m2(x), g.round(x)) << std::hex << u;
  }
  for (uint32_t u = 0x47000000u; u < 0x48000000u; u += 61) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e5m2(x), g.round(x)) << std::hex << u;
  }
}

// ---- UE8M0 -----------------------------------------------------------------------------------
uint8_t ref_ue8m0_rp(float x) {
  if (std::isnan(x)) return 0xFF;
  const double a = std::fabs(static_cast<double>(x));
  for (int e = 0; e <= 0xFE; ++e)
    if (std::ldexp(1.0, e - 127) >= a) return static_cast<uint8_t>(e);
  return 0xFE;  // above 2^127 (and Inf): satfinite
}

TEST(NumericsFp8, Ue8m0DecodeTable) {
  for (int e = 0; e < 255; ++e) {
    const float f = num::ue8m0_to_float(static_cast<uint8_t>(e));
    EXPECT_EQ(static_cast<double>(f), std::ldexp(1.0, e - 127)) << e;
    EXPECT_EQ(num::float_to_ue8m0_rp(f), e) << e;
  }
  EXPECT_TRUE(std::isnan(num::ue8m0_to_float(0xFF)));
}

TEST(NumericsFp8, Ue8m0RoundUpEdges) {
  EXPECT_EQ(num::float_to_ue8m0_rp(1.0f), 0x7F);
  EXPECT_EQ(num::float_to_ue8m0_rp(1.5f), 0x80);   // SPEC-GPU §5: rp 1.5 -> 0x80
  EXPECT_EQ(num::float_to_ue8m0_rp(3.0f), 0x81);
  EXPECT_EQ(num::float_to_ue8m0_rp(0.7f), 0x7F);
  EXPECT_EQ(num::float_to_ue8m0_rp(0.0f), 0x00);
  EXPECT_EQ(num::float_to_ue8m0_rp(-0.0f), 0x00);
  EXPECT_EQ(num::float_to_ue8m0_rp(-3.0f), 0x81);  // |x| (CUDA host path)
  EXPECT_EQ(num::float_to_ue8m0_rp(0x1p-127f), 0x00);
  EXPECT_EQ(num::float_to_ue8m0_rp(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(num::float_to_ue8m0_rp(num::bits_float(0x00400001u)), 0x01);
  EXPECT_EQ(num::float_to_ue8m0_rp(0x1p-126f), 0x01);
  EXPECT_EQ(num::float_to_ue8m0_rp(0x1p127f), 0xFE);
  EXPECT_EQ(num::float_to_ue8m0_rp(FLT_MAX), 0xFE);  // 2^128 would be 0xFF: satfinite
  EXPECT_EQ(num::float_to_ue8m0_rp(kFp8Inf), 0xFE);     // Inf -> 2^127 (satfinite, as the CUDA host path)
  EXPECT_EQ(num::float_to_ue8m0_rp(kFp8NaN), 0xFF);
}

TEST(NumericsFp8, Ue8m0MatchesReferenceOnSampledBitPatterns) {
  sweep(65521, [&](uint32_t u) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_ue8m0_rp(x), ref_ue8m0_rp(x)) << std::hex << u;
  });
  // Around 2^-127 (float subnormals), 1.0 and 2^127.
  for (uint32_t base : {0x00000000u, 0x00400000u, 0x3F000000u, 0x3F800000u, 0x7F000000u, 0x7F7F0000u})
    for (uint32_t d = 0; d < 4096; ++d) {
      const float x = num::bits_float(base + d);
      ASSERT_EQ(num::float_to_ue8m0_rp(x), ref_ue8m0_rp(x)) << std::hex << base + d;
      const float y = num::bits_float(base - d);
      ASSERT_EQ(num::float_to_ue8m0_rp(y), ref_ue8m0_rp(y)) << std::hex << base - d;
    }
}

// ---- recipe scale math ----------------------------------------------------------------------
TEST(NumericsFp8, CurrentScaling) {
  EXPECT_EQ(num::fp8_current_scale(448.0f, num::kE4M3Max), 1.0f);
  EXPECT_EQ(num::fp8_current_scale(2.0f, num::kE4M3Max), 224.0f);
  EXPECT_EQ(num::fp8_current_scale(3.0f, num::kE4M3Max), 448.0f / 3.0f);  // one RN division
  EXPECT_EQ(num::fp8_current_scale(3.0f, num::kE5M2Max), 57344.0f / 3.0f);
  EXPECT_EQ(num::fp8_current_scale(0.0f, num::kE4M3Max), 1.0f);
  EXPECT_EQ(num::fp8_current_scale(kFp8Inf, num::kE4M3Max), 1.0f);
  EXPECT_EQ(num::fp8_current_scale(kFp8NaN, num::kE4M3Max), 1.0f);
  EXPECT_EQ(num::fp8_current_scale(1e-40f, num::kE4M3Max), FLT_MAX);  // 448/1e-40 overflows
  EXPECT_EQ(num::fp8_current_scale(1e-30f, num::kE4M3Max), 448.0f / 1e-30f);
  // amax * scale never exceeds the format max by more than the division's rounding.
  std::mt19937 rng(11);
  for (int i = 0; i < 100000; ++i) {
    const float amax = std::ldexp(1.0f + (rng() % 8388608) * 0x1p-23f, static_cast<int>(rng() % 200) - 100);
    const float s = num::fp8_current_scale(amax, num::kE4M3Max);
    EXPECT_EQ(num::float_to_e4m3(amax * s), 0x7E) << amax;
    EXPECT_EQ(num::float_to_e5m2(amax * num::fp8_current_scale(amax, num::kE5M2Max)), 0x7B) << amax;
  }
}

TEST(NumericsFp8, Mxfp8Scales) {
  // The element scale is 2^(127-e) exactly for e in 1..253, with TE's exp2f_rcp edge cases.
  for (int e = 1; e < 254; ++e)
    EXPECT_EQ(static_cast<double>(num::mxfp8_element_scale(static_cast<uint8_t>(e))), std::ldexp(1.0, 127 - e)) << e;
  EXPECT_TRUE(std::isnan(num::mxfp8_element_scale(0xFF)));
  EXPECT_EQ(num::mxfp8_element_scale(0), 1.0f);    // TE: biased_exp == 0 -> 1
  EXPECT_EQ(num::mxfp8_element_scale(254), 0.0f);  // TE: (254 - 254) << 23 = +0
  // The block scale is ue8m0_rp(bamax * f32(1/448)).
  const float rcp448 = 1.0f / num::kE4M3Max;
  EXPECT_EQ(num::float_bits(rcp448), 0x3B124925u);
  EXPECT_EQ(num::mxfp8_block_scale(0.0f), 0x00);
  EXPECT_EQ(num::mxfp8_block_scale(1.0f), 119);            // 1/448 -> 2^-8 (round up)
  EXPECT_EQ(num::mxfp8_block_scale(448.0f), num::float_to_ue8m0_rp(448.0f * rcp448));
  EXPECT_EQ(num::mxfp8_block_scale(kFp8Inf), 0xFE);
  EXPECT_EQ(num::mxfp8_block_scale(kFp8NaN), 0xFF);
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const float bamax = std::ldexp(1.0f + (rng() % 8388608) * 0x1p-23f, static_cast<int>(rng() % 220) - 110);
    const uint8_t e = num::mxfp8_block_scale(bamax);
    ASSERT_EQ(e, num::float_to_ue8m0_rp(bamax * rcp448));
    // The largest element lands in (224, 448] up to the rounding of the 1/448 multiply: no saturation.
    const double scaled = static_cast<double>(bamax) * std::ldexp(1.0, 127 - e);
    ASSERT_LE(scaled, 448.0 * (1 + 0x1p-23)) << bamax;
    ASSERT_GT(scaled, 224.0 * (1 - 0x1p-23)) << bamax;
    ASSERT_EQ(num::float_to_e4m3(bamax * num::mxfp8_element_scale(e)) & 0x7F,
              num::float_to_e4m3(static_cast<float>(scaled)) & 0x7F);
  }
}

// ---- against the CUDA headers' host conversions ----------------------------------------------
#if defined(PL_HAVE_CUDA_HEADERS)
uint8_t cuda_e4m3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
uint8_t cuda_e5m2(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); }
uint8_t cuda_ue8m0(float x) { return __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf); }

TEST(NumericsFp8, BitExactWithCudaHostConversionsSampled) {
  int64_t n = 0;
  sweep(257, [&](uint32_t u) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e4m3(x), cuda_e4m3(x)) << std::hex << "e4m3 0x" << u;
    ASSERT_EQ(num::float_to_e5m2(x), cuda_e5m2(x)) << std::hex << "e5m2 0x" << u;
    ASSERT_EQ(num::float_to_ue8m0_rp(x), cuda_ue8m0(x)) << std::hex << "ue8m0 0x" << u;
    ++n;
  });
  EXPECT_GT(n, 16000000);
}

TEST(NumericsFp8, BitExactWithCudaHostConversionsAtBoundaryBinades) {
  // E4M3: ties to zero (2^-10), subnormals (2^-9..2^-7), min normal (2^-6), max and saturation (2^8, 2^9).
  binades(-10, -6, [](uint32_t u) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e4m3(x), cuda_e4m3(x)) << std::hex << u;
  });
  binades(8, 9, [](uint32_t u) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e4m3(x), cuda_e4m3(x)) << std::hex << u;
  });
  // E5M2: ties to zero (2^-17), subnormals, min normal (2^-14), max and saturation (2^15, 2^16).
  binades(-17, -14, [](uint32_t u) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e5m2(x), cuda_e5m2(x)) << std::hex << u;
  });
  binades(15, 16, [](uint32_t u) {
    const float x = num::bits_float(u);
    ASSERT_EQ(num::float_to_e5m2(x), cuda_e5m2(x)) << std::hex << u;
  });
  // UE8M0: every float subnormal (around the 2^-127 minimum), the 2^127 binade, Inf and NaNs.
  for (uint32_t m = 0; m < (1u << 23); ++m)
    for (uint32_t base : {0x00000000u, 0x7F000000u, 0x7F800000u}) {
      const float x = num::bits_float(base | m);
      ASSERT_EQ(num::float_to_ue8m0_rp(x), cuda_ue8m0(x)) << std::hex << (base | m);
    }
}

TEST(NumericsFp8, DecodeTablesMatchCuda) {
  for (int c = 0; c < 256; ++c) {
    __nv_fp8_e4m3 a;
    a.__x = static_cast<__nv_fp8_storage_t>(c);
    __nv_fp8_e5m2 b;
    b.__x = static_cast<__nv_fp8_storage_t>(c);
    const float fa = static_cast<float>(a), fb = static_cast<float>(b);
    const float oa = num::e4m3_to_float(static_cast<uint8_t>(c)), ob = num::e5m2_to_float(static_cast<uint8_t>(c));
    if (std::isnan(fa)) {
      EXPECT_TRUE(std::isnan(oa)) << c;
    } else {
      EXPECT_EQ(num::float_bits(oa), num::float_bits(fa)) << c;
    }
    if (std::isnan(fb)) {
      EXPECT_TRUE(std::isnan(ob)) << c;
    } else {
      EXPECT_EQ(num::float_bits(ob), num::float_bits(fb)) << c;
    }
    __nv_fp8_e8m0 s;
    s.__x = static_cast<__nv_fp8_storage_t>(c);
    const float fs = static_cast<float>(s), os = num::ue8m0_to_float(static_cast<uint8_t>(c));
    if (std::isnan(fs)) {
      EXPECT_TRUE(std::isnan(os)) << c;
    } else {
      EXPECT_EQ(num::float_bits(os), num::float_bits(fs)) << c;
    }
  }
}
#else
TEST(NumericsFp8, BitExactWithCudaHostConversionsSampled) {
  GTEST_SKIP() << "CUDA headers not available in this build (configure with nvcc present)";
}
#endif

}  // namespace
}  // namespace pl
