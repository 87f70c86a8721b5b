// NVFP4 scale math and one-block quantizers (lib/numerics/nvfp4.h), TE v2.14+ formulas: the worked
// examples of SPEC-NVFP4 §1.7 bit for bit, the edge cases of §1.3-§1.5 (zeros, max, Inf, NaN, scale
// underflow), the v2.14 vs v2.8 difference, agreement with a re-composition from the CUDA headers'
// host conversions (when present), and stochastic-rounding blocks.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "numerics/bf16.h"
#include "numerics/nvfp4.h"
#include "numerics/philox.h"

#if defined(PL_HAVE_CUDA_HEADERS)
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#endif

namespace pl {
namespace {

constexpr float kNvfp4Inf = std::numeric_limits<float>::infinity();
constexpr float kNvfp4NaN = std::numeric_limits<float>::quiet_NaN();

struct Block {
  uint8_t scale;
  uint8_t codes[16];
};
Block quantize(const std::vector<float>& x, float amax) {
  Block b{};
  num::nvfp4_quantize_block16(x.data(), num::nvfp4_global_encode_scale(amax), &b.scale, b.codes);
  return b;
}
std::vector<int> codes_of(const Block& b) { return std::vector<int>(b.codes, b.codes + 16); }

TEST(NumericsNvfp4, Constants) {
  volatile float six = 6.0f, g = 2688.0f, a = 7225344.0f, one = 1.0f;
  EXPECT_EQ(num::float_bits(num::kRcpSix), 0x3E2AAAABu);
  EXPECT_EQ(num::kRcpSix, one / six);
  EXPECT_EQ(num::kRcp2688, one / g);
  EXPECT_EQ(num::kRcp7225344, one / a);
  EXPECT_EQ(num::kNvfp4GlobalMax, num::kE4M3Max * num::kE2M1Max);
}

TEST(NumericsNvfp4, WorkedExample) {
  // SPEC-NVFP4 §1.7.
  const std::vector<float> x = {1.2890625f, 1.453125f, 0.06640625f, -0.765625f, -1.09375f, 0.03125f,
                                -1.0234375f, -1.4375f, 0.19921875f, 0.1337890625f, 0.546875f, -0.9140625f,
                                0.0050048828125f, -0.06494140625f, -1.5078125f, 0.5390625f};
  for (float v : x) ASSERT_EQ(v, num::round_bf16(v));  // BF16 values
  const float s_enc = num::nvfp4_global_encode_scale(3.5f);
  EXPECT_EQ(s_enc, 768.0f);
  EXPECT_EQ(num::nvfp4_global_decode_scale(s_enc), 1.0f / 768.0f);
  EXPECT_EQ(num::nvfp4_abs_max(x.data(), 16), 1.5078125f);
  EXPECT_EQ(1.5078125f * num::nvfp4_block_scale_multiplier(s_enc), 193.0f);  // sf
  const Block b = quantize(x, 3.5f);
  EXPECT_EQ(b.scale, 0x74);
  EXPECT_EQ(num::e4m3_to_float(b.scale), 192.0f);
  EXPECT_EQ(num::nvfp4_block_encode(b.scale, 1.0f / 768.0f), 4.0f);
  EXPECT_EQ(codes_of(b), (std::vector<int>{7, 7, 1, 13, 14, 0, 14, 15, 2, 1, 4, 14, 0, 9, 15, 4}));
  const uint8_t want_packed[8] = {0x77, 0xd1, 0x0e, 0xfe, 0x12, 0xe4, 0x90, 0x4f};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(num::pack_e2m1_pair(b.codes[2 * j], b.codes[2 * j + 1]), want_packed[j]) << j;
  EXPECT_EQ(b.scale, num::nvfp4_block_scale_v28(1.5078125f, s_enc));  // both formulas agree here
  // Dequantization (§1.6): factor = f32(f32(192 * 3.5) * f32(1/2688)).
  volatile float s192 = 192.0f, amax = 3.5f;
  const float factor = num::nvfp4_dequant_factor(b.scale, 3.5f);
  EXPECT_EQ(factor, (s192 * amax) * num::kRcp2688);
  EXPECT_NEAR(factor, 0.25f, 1e-7f);
  for (int i = 0; i < 16; ++i)
    EXPECT_NEAR(num::nvfp4_dequant(b.codes[i], factor), x[i], 0.25 * 0.5 * 2 + 1e-6) << i;
}

TEST(NumericsNvfp4, OtherSpecVectors) {
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = num::round_bf16(3.0f * (static_cast<float>(i) - 7.5f) / 7.5f);
  EXPECT_EQ(num::nvfp4_abs_max(x.data(), 16), 3.0f);
  Block b = quantize(x, 3.0f);
  EXPECT_EQ(b.scale, 0x7E);
  EXPECT_EQ(num::nvfp4_block_encode(b.scale, num::nvfp4_global_decode_scale(num::nvfp4_global_encode_scale(3.0f))),
            2.0f);
  EXPECT_EQ(codes_of(b), (std::vector<int>{15, 15, 14, 14, 13, 12, 10, 9, 1, 2, 4, 5, 6, 6, 7, 7}));
  // +-0.001 block in a tensor of amax 1000: scale underflows to 0, enc = FLT_MAX, codes saturate.
  for (int i = 0; i < 16; ++i) x[i] = (i % 2) ? -0.001f : 0.001f;
  b = quantize(x, 1000.0f);
  EXPECT_EQ(b.scale, 0x00);
  EXPECT_EQ(num::nvfp4_block_encode(0x00, num::nvfp4_global_decode_scale(num::nvfp4_global_encode_scale(1000.0f))),
            FLT_MAX);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b.codes[i], (i % 2) ? 15 : 7) << i;
}

TEST(NumericsNvfp4, ScaleUnderflowBlockKeepsZerosAndTinyValues) {
  // §1.5: zeros stay 0 (-0 -> 8), BF16-subnormal elements get ordinary codes (1e-39 * FLT_MAX = 0.34 -> 0.5).
  std::vector<float> x(16, 0.0f);
  x[0] = 0.001f;
  x[1] = -0.001f;
  x[2] = -0.0f;
  x[3] = 1e-39f;
  x[4] = -1e-39f;
  x[5] = 1e-45f;  // FLT denorm_min * FLT_MAX ~ 4.8e-7 -> 0
  const Block b = quantize(x, 1000.0f);
  EXPECT_EQ(b.scale, 0x00);
  EXPECT_EQ(codes_of(b), (std::vector<int>{7, 15, 8, 1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(NumericsNvfp4, GlobalScaleEdges) {
  EXPECT_EQ(num::nvfp4_global_encode_scale(0.0f), 1.0f);
  EXPECT_EQ(num::nvfp4_global_encode_scale(kNvfp4Inf), 1.0f);   // 2688/Inf = 0 -> 1
  EXPECT_EQ(num::nvfp4_global_encode_scale(1e-40f), FLT_MAX);  // 2688/1e-40 = Inf -> FLT_MAX
  EXPECT_EQ(num::nvfp4_global_encode_scale(kNvfp4NaN), FLT_MAX);    // fminf drops the NaN (kernels)
  EXPECT_EQ(num::nvfp4_global_encode_scale(2688.0f), 1.0f);
  EXPECT_EQ(num::nvfp4_global_encode_scale(3.0f), 896.0f);
  volatile float g = 2688.0f, a = 1.7f;
  EXPECT_EQ(num::nvfp4_global_encode_scale(1.7f), g / a);
}

TEST(NumericsNvfp4, AllZerosAndAllMax) {
  std::vector<float> z(16, 0.0f);
  z[5] = -0.0f;
  Block b = quantize(z, 0.0f);
  EXPECT_EQ(num::nvfp4_global_encode_scale(0.0f), 1.0f);
  EXPECT_EQ(b.scale, 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b.codes[i], i == 5 ? 8 : 0) << i;
  // Every element at the tensor amax: scale 448, codes +-6, for ordinary and extreme amaxes (TE's
  // "all dtype-max" extrema test uses the BF16 max).
  for (float m : {5.0f, 1.0f, 3.5f, 0.1f, 1e-20f, 1e20f, num::bf16_bits_to_float(0x7F7F), 448.0f * 6.0f}) {
    std::vector<float> x(16, m);
    for (int i = 8; i < 16; ++i) x[i] = -m;
    b = quantize(x, m);
    EXPECT_EQ(b.scale, 0x7E) << m;
    for (int i = 0; i < 16; ++i) EXPECT_EQ(b.codes[i], i < 8 ? 7 : 15) << m << " " << i;
  }
}

TEST(NumericsNvfp4, InfAndNaNInputs) {
  // amax = Inf -> S_enc = 1; the block holding Inf: sf = Inf -> FLT_MAX -> E4M3 448; Inf -> +-6.
  std::vector<float> x(16, 1.0f);
  x[0] = kNvfp4Inf;
  x[1] = -kNvfp4Inf;
  x[2] = 448.0f * 3.0f;  // 3 after scaling
  Block b = quantize(x, kNvfp4Inf);
  EXPECT_EQ(b.scale, 0x7E);
  EXPECT_EQ(b.codes[0], 7);
  EXPECT_EQ(b.codes[1], 15);
  EXPECT_EQ(b.codes[2], 5);
  EXPECT_EQ(b.codes[3], 0);  // 1/448 -> 0
  EXPECT_EQ(num::nvfp4_gemm_alpha(kNvfp4Inf, 2.0f), kNvfp4Inf);  // Inf propagates through alpha (§1.5)
  // NaN elements: ignored by the block amax, coded +6 (0x7) whatever the sign.
  for (int i = 0; i < 16; ++i) x[i] = 0.25f * static_cast<float>(i) - 2.0f;
  x[4] = kNvfp4NaN;
  x[6] = -kNvfp4NaN;
  EXPECT_EQ(num::nvfp4_abs_max(x.data(), 16), 2.0f);
  b = quantize(x, 2.0f);
  const Block ref = [&] {
    std::vector<float> y = x;
    y[4] = y[6] = 0.0f;
    return quantize(y, 2.0f);
  }();
  EXPECT_EQ(b.scale, ref.scale);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b.codes[i], (i == 4 || i == 6) ? 7 : ref.codes[i]) << i;
}

TEST(NumericsNvfp4, V214VersusV28BlockScale) {
  // §1.4: the two TE formulas differ on ~0.1% of blocks; we implement v2.14+.
  const float s_enc = num::nvfp4_global_encode_scale(1.96875f);
  EXPECT_EQ(num::nvfp4_block_scale(0.369140625f, s_enc), 0x6B);
  EXPECT_EQ(num::nvfp4_block_scale_v28(0.369140625f, s_enc), 0x6A);
  // And the v2.14+ formula is exactly bamax * f32(S_enc * f32(1/6)).
  std::mt19937 rng(3);
  int differ = 0;
  for (int i = 0; i < 200000; ++i) {
    const float amax = num::round_bf16(std::ldexp(1.0f + (rng() % 128) / 128.0f, static_cast<int>(rng() % 20) - 10));
    const float bamax = num::round_bf16(amax * static_cast<float>(rng() % 1024 + 1) / 1024.0f);
    const float s = num::nvfp4_global_encode_scale(amax);
    volatile float mult = s * num::kRcpSix;
    ASSERT_EQ(num::nvfp4_block_scale(bamax, s), num::float_to_e4m3(bamax * mult));
    differ += num::nvfp4_block_scale(bamax, s) != num::nvfp4_block_scale_v28(bamax, s);
  }
  EXPECT_GT(differ, 0);
  EXPECT_LT(differ, 2000);  // rare (~0.1%)
}

TEST(NumericsNvfp4, GemmAlphaAndDequantFactor) {
  volatile float a = 3.5f, b = 1.25f, one = 1.0f;
  EXPECT_EQ(num::nvfp4_gemm_alpha(3.5f, 1.25f), ((one * a) * b) * num::kRcp7225344);
  EXPECT_EQ(num::nvfp4_gemm_alpha(2688.0f, 2688.0f), (2688.0f * 2688.0f) * num::kRcp7225344);
  EXPECT_NEAR(num::nvfp4_gemm_alpha(2688.0f, 2688.0f), 1.0f, 1e-6f);
  volatile float s = 104.0f, m = 0.7f;
  EXPECT_EQ(num::nvfp4_dequant_factor(0x6D, 0.7f), (s * m) * num::kRcp2688);  // 0x6D = 104
  EXPECT_EQ(num::nvfp4_dequant_factor(0x00, 5.0f), 0.0f);
}

// Random BF16 blocks with wide in-block dynamic range and random tensor amax >= bamax.
std::vector<float> random_block(std::mt19937& rng, float* amax) {
  std::vector<float> x(16);
  const int base = static_cast<int>(rng() % 40) - 20;
  for (float& v : x) {
    const int e = base - static_cast<int>(rng() % 24);
    v = num::round_bf16(std::ldexp(1.0f + (rng() % 128) / 128.0f, e) * ((rng() & 1) ? -1.0f : 1.0f));
    if (rng() % 17 == 0) v = 0.0f;
  }
  const float bamax = num::nvfp4_abs_max(x.data(), 16);
  *amax = (rng() % 4 == 0) ? bamax : num::round_bf16(bamax * std::ldexp(1.0f, static_cast<int>(rng() % 24)));
  return x;
}

TEST(NumericsNvfp4, BlockPropertiesOnRandomBlocks) {
  std::mt19937 rng(17);
  for (int t = 0; t < 50000; ++t) {
    float amax;
    const std::vector<float> x = random_block(rng, &amax);
    const float s_enc = num::nvfp4_global_encode_scale(amax);
    const Block b = quantize(x, amax);
    ASSERT_EQ(b.scale & 0x80, 0);  // never negative
    const float enc = num::nvfp4_block_encode(b.scale, num::nvfp4_global_decode_scale(s_enc));
    const float factor = num::nvfp4_dequant_factor(b.scale, amax);
    for (int i = 0; i < 16; ++i) {
      const float scaled = x[i] * enc;
      ASSERT_EQ(b.codes[i], num::float_to_e2m1(scaled));
      // Error in the scaled domain: half a grid step (<= 1) plus any saturation excess.
      const double err = std::fabs(num::e2m1_to_float(b.codes[i]) - static_cast<double>(scaled));
      ASSERT_LE(err, 1.0 + std::fmax(0.0, std::fabs(static_cast<double>(scaled)) - 6.0)) << t;
      // The GEMM-side factor is 1/enc up to rounding when the scale is an E4M3 normal.
      if (b.scale >= 0x08) {
        ASSERT_NEAR(static_cast<double>(factor) * enc, 1.0, 1e-6);
      }
    }
  }
}

TEST(NumericsNvfp4, StochasticRoundingBlock) {
  std::mt19937 rng(23);
  for (int t = 0; t < 5000; ++t) {
    float amax;
    const std::vector<float> x = random_block(rng, &amax);
    const float s_enc = num::nvfp4_global_encode_scale(amax);
    const Block rn = quantize(x, amax);
    const float enc = num::nvfp4_block_encode(rn.scale, num::nvfp4_global_decode_scale(s_enc));
    uint8_t rbits[16];
    num::sr_random_bytes16(5, 1, static_cast<uint64_t>(t), 0, rbits);
    Block sr{};
    num::nvfp4_quantize_block16_sr(x.data(), s_enc, rbits, &sr.scale, sr.codes);
    ASSERT_EQ(sr.scale, rn.scale);  // only the element conversion is stochastic
    for (int i = 0; i < 16; ++i) {
      ASSERT_EQ(sr.codes[i], num::float_to_e2m1_sr(x[i] * enc, rbits[i]));
      ASSERT_EQ(sr.codes[i], num::nvfp4_encode_sr(x[i], enc, rbits[i]));
      // SR picks one of the two grid neighbours of the scaled value; RN picks the nearer one.
      const double s = std::fabs(static_cast<double>(x[i] * enc));
      const double q = std::fabs(static_cast<double>(num::e2m1_to_float(sr.codes[i])));
      const double step = s < 2 ? 0.5 : (s < 4 ? 1.0 : 2.0);
      ASSERT_TRUE(s >= 6 ? q == 6 : (q <= s + step && q >= s - step)) << s << " " << q;
    }
  }
}

#if defined(PL_HAVE_CUDA_HEADERS)
// The same v2.14+ composition written with the CUDA headers' host conversions.
Block cuda_quantize(const std::vector<float>& x, float amax) {
  float s_enc = 2688.0f / amax;
  s_enc = std::fmin(s_enc, FLT_MAX);
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  const float s_dec = 1.0f / s_enc;
  float bamax = 0.0f;
  for (float v : x) bamax = std::fmax(bamax, std::fabs(v));
  const float sf = std::fmin(bamax * (s_enc * (1.0f / 6.0f)), FLT_MAX);
  Block b{};
  b.scale = __nv_cvt_float_to_fp8(sf, __NV_SATFINITE, __NV_E4M3);
  __nv_fp8_e4m3 s8;
  s8.__x = b.scale;
  const float enc = std::fmin(1.0f / (static_cast<float>(s8) * s_dec), FLT_MAX);
  for (int i = 0; i < 16; ++i) b.codes[i] = __nv_cvt_float_to_fp4(x[i] * enc, __NV_E2M1, cudaRoundNearest);
  return b;
}

TEST(NumericsNvfp4, MatchesCompositionFromCudaHostConversions) {
  std::mt19937 rng(29);
  for (int t = 0; t < 100000; ++t) {
    float amax;
    std::vector<float> x = random_block(rng, &amax);
    if (t % 50 == 0) x[rng() % 16] = (t % 100 == 0) ? kNvfp4NaN : -kNvfp4Inf;
    if (t % 50 == 0 && std::isinf(x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6] + x[7] + x[8] + x[9] + x[10] +
                                  x[11] + x[12] + x[13] + x[14] + x[15]))
      amax = kNvfp4Inf;
    const Block ours = quantize(x, amax), ref = cuda_quantize(x, amax);
    ASSERT_EQ(ours.scale, ref.scale) << t;
    ASSERT_EQ(codes_of(ours), codes_of(ref)) << t;
  }
}
#else
TEST(NumericsNvfp4, MatchesCompositionFromCudaHostConversions) {
  GTEST_SKIP() << "CUDA headers not available in this build (configure with nvcc present)";
}
#endif

}  // namespace
}  // namespace pl
