#pragma once
// NVFP4 scale math and one-block quantizers, TE v2.14+ formulas (SPEC-NVFP4 §1.3-§1.7), with every
// FP32 operation separate (RN) and in TE's order. TE sources followed (as cited by the spec):
// common/cast/nvfp4/core_nvfp4.cuh (compute_global_encode_scaling_factor_FP4, block scale),
// quantize_transpose_nvfp4.cuh / specialized/quantize_transpose_nvfp4_tuned_1D.cuh
// (compute_nvfp4_scaling_coefficient), dequantize_nvfp4.cuh, recipe/nvfp4.cu (GEMM alpha).
// Behaviour at the edges follows the GPU kernels, not TE's PyTorch reference: NaN elements -> +6
// (code 7), results rounding to -0 keep the sign (code 8), amax == 0 -> S_enc = 1.
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "numerics/bf16.h"
#include "numerics/fp4.h"
#include "numerics/fp8.h"
#include "numerics/hd.h"

namespace pl::num {

constexpr float kNvfp4GlobalMax = 2688.0f;            // 448 * 6
constexpr float kRcpSix = 0x1.555556p-3f;             // f32(1/6), bits 0x3E2AAAAB
constexpr float kRcp2688 = 0x1.861862p-12f;           // f32(1/2688), bits 0x39C30C31
constexpr float kRcp7225344 = 0x1.293726p-23f;        // f32(1/(6*6*448*448)), bits 0x34149B93

// Per-tensor encode scale (§1.3): S_enc = f32(2688/amax); fminf(S_enc, FLT_MAX) (tiny amax -> Inf ->
// FLT_MAX; NaN amax -> FLT_MAX as fminf drops the NaN); amax == 0 or S_enc == 0 (amax = Inf) -> 1.
PL_HD float nvfp4_global_encode_scale(float amax) {
  const float s = fminf(kNvfp4GlobalMax / amax, FLT_MAX);
  return amax == 0.0f || s == 0.0f ? 1.0f : s;
}

// S_dec = f32(1/S_enc).
PL_HD float nvfp4_global_decode_scale(float s_enc) { return 1.0f / s_enc; }

// The per-tensor multiplier of the v2.14+ block-scale formula: f32(S_enc * f32(1/6)).
PL_HD float nvfp4_block_scale_multiplier(float s_enc) { return s_enc * kRcpSix; }

// Stored E4M3 block scale (§1.4, TE v2.14+): sf = fminf(f32(bamax * f32(S_enc * f32(1/6))), FLT_MAX);
// E4M3 RN satfinite. bamax = max |x| over the block (16 elements, or the 16x16 tile for 2D).
PL_HD uint8_t nvfp4_block_scale(float block_amax, float s_enc) {
  return float_to_e4m3(fminf(block_amax * nvfp4_block_scale_multiplier(s_enc), FLT_MAX));
}

// The TE v2.8-v2.13 formula, sf = f32(f32(bamax / 6) * S_enc): NOT the project's choice; kept only so
// tests can show the difference (§1.4).
PL_HD uint8_t nvfp4_block_scale_v28(float block_amax, float s_enc) {
  return float_to_e4m3(fminf((block_amax / 6.0f) * s_enc, FLT_MAX));
}

// Per-block encode scale (§1.5): enc_b = fminf(f32(1 / f32(float(scale) * S_dec)), FLT_MAX)
// (scale 0 -> 1/0 = Inf -> FLT_MAX).
PL_HD float nvfp4_block_encode(uint8_t scale, float s_dec) {
  return fminf(1.0f / (e4m3_to_float(scale) * s_dec), FLT_MAX);
}

// Element code, RN: E2M1(f32(x * enc_b)).
PL_HD uint8_t nvfp4_encode(float x, float enc) { return float_to_e2m1(x * enc); }

// Element code, stochastic rounding: E2M1_SR(f32(x * enc_b), rbits) (§4, fp4.h).
PL_HD uint8_t nvfp4_encode_sr(float x, float enc, uint8_t rbits) { return float_to_e2m1_sr(x * enc, rbits); }

// Dequantization factor of a block (§1.6, TE dequantize kernel): f32(f32(float(scale) * amax) * f32(1/2688)).
// The dequantized element is f32(e2m1_to_float(code) * factor).
PL_HD float nvfp4_dequant_factor(uint8_t scale, float amax) {
  return (e4m3_to_float(scale) * amax) * kRcp2688;
}

PL_HD float nvfp4_dequant(uint8_t code, float factor) { return e2m1_to_float(code) * factor; }

// GEMM alpha as TE computes it on the device (§6.1): f32(f32(f32(1 * amax_a) * amax_b) * f32(1/7225344)).
PL_HD float nvfp4_gemm_alpha(float amax_a, float amax_b) {
  return ((1.0f * amax_a) * amax_b) * kRcp7225344;
}

// Max |x| over n values as the kernels reduce it: fmaxf(fabsf), NaN ignored, Inf kept.
PL_HD float nvfp4_abs_max(const float* x, int n) {
  // m starts at 0 and never becomes NaN, so "a > m ? a : m" is fmaxf(m, a) exactly (a NaN a is
  // ignored, Inf kept) without a libm call on the host.
  float m = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = fabsf(x[i]);
    m = a > m ? a : m;
  }
  return m;
}

// The scale byte of a block whose max |x| is block_amax (written to *scale_out) and its element encode
// factor enc_b (returned): §1.4-1.5 for s_enc, the per-tensor encode scale. A 1x16 block passes its own
// amax (nvfp4_abs_max), a 16x16 weight tile the tile's.
PL_HD float nvfp4_block_scale_and_encode(float block_amax, float s_enc, uint8_t* scale_out) {
  *scale_out = nvfp4_block_scale(block_amax, s_enc);
  return nvfp4_block_encode(*scale_out, nvfp4_global_decode_scale(s_enc));
}

// One 1x16 block, RN (§1.10): writes the E4M3 scale byte and 16 codes (unpacked, one per byte).
// s_enc is the per-tensor encode scale (nvfp4_global_encode_scale of the tensor amax).
PL_HD void nvfp4_quantize_block16(const float* x, float s_enc, uint8_t* scale_out, uint8_t codes_out[16]) {
  const float enc = nvfp4_block_scale_and_encode(nvfp4_abs_max(x, 16), s_enc, scale_out);
  for (int i = 0; i < 16; ++i) codes_out[i] = nvfp4_encode(x[i], enc);
}

// Same with stochastic rounding of the codes; rbits[i] is element i's random byte (philox.h).
PL_HD void nvfp4_quantize_block16_sr(const float* x, float s_enc, const uint8_t rbits[16], uint8_t* scale_out,
                                     uint8_t codes_out[16]) {
  const float enc = nvfp4_block_scale_and_encode(nvfp4_abs_max(x, 16), s_enc, scale_out);
  for (int i = 0; i < 16; ++i) codes_out[i] = nvfp4_encode_sr(x[i], enc, rbits[i]);
}

// Storage byte of elements 2j (lo, bits 3:0) and 2j+1 (hi, bits 7:4) (§1.1).
PL_HD uint8_t pack_e2m1_pair(uint8_t lo, uint8_t hi) {
  return static_cast<uint8_t>((lo & 0xFu) | ((hi & 0xFu) << 4));
}

}  // namespace pl::num
