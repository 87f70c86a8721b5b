#pragma once
// FP8 conversions (E4M3 "FN", E5M2, UE8M0) and the scale math of the FP8 recipes (per-tensor current
// scaling, MXFP8). Plain integer/float arithmetic with a fixed operation order, identical on host and
// device (SPEC-NVFP4 §1.2, §5.3; SPEC-GPU §5). Bit-exact with cuda_fp8.h's host conversions
// (__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...), __nv_cvt_float_to_e8m0(x, __NV_SATFINITE,
// cudaRoundPosInf)) for every input, NaN included (tests/numerics/test_fp8.cpp), and with the
// sm_89+/sm_100 cvt.rn.satfinite / cvt.rp.satfinite instructions for every non-NaN input.
#include <cfloat>
#include <cstdint>

#include "numerics/bf16.h"  // float_bits / bits_float
#include "numerics/hd.h"

namespace pl::num {

constexpr float kE4M3Max = 448.0f;    // 0x7E
constexpr float kE5M2Max = 57344.0f;  // 0x7B

namespace detail {

// Rounds a finite, non-negative float given by its bits `a` (sign cleared, a <= 0x7F800000 and the
// value not above the target's max finite) to the nearest value of a minifloat with `M` mantissa
// bits and exponent bias `B` (subnormals supported), ties to even. Returns the magnitude code
// (exponent field << M | mantissa). The caller handles NaN, saturation and the sign.
PL_HD uint32_t round_to_minifloat_mag(uint32_t a, int M, int B) {
  const uint32_t min_normal = static_cast<uint32_t>(127 + 1 - B) << 23;  // 2^(1-B)
  if (a >= min_normal) {
    // Normal result: RNE on the float bits; a mantissa carry moves into the exponent field, which is
    // exactly the next binade (and never reaches NaN/Inf because the caller saturated first).
    const int drop = 23 - M;
    const uint32_t lsb = (a >> drop) & 1u;
    const uint32_t r = (a + ((1u << (drop - 1)) - 1u) + lsb) >> drop;
    return r - (static_cast<uint32_t>(127 - B) << M);
  }
  // Subnormal (or zero) result: count of quanta 2^(1-B-M), rounded to nearest even. A float value is
  // mant * 2^(e-150) with the implicit bit in mant; the count is mant * 2^(e-150-(1-B-M)).
  const uint32_t e = a >> 23;
  if (e == 0) return 0;  // float subnormal: far below half the smallest target quantum
  const uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
  const int s = 151 - B - M - static_cast<int>(e);  // >= 1 here
  if (s > 25) return 0;                              // value < quantum/2
  const uint32_t q = mant >> s;
  const uint32_t rem = mant & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1u : q;  // q+1 == 2^M is the min normal code
}

// float -> FP8 with M mantissa bits and bias B, round to nearest even, saturating: |x| above the max finite
// value (float bits max_bits, code max_code; +-Inf too) -> +-max_code; NaN -> 0x7F whatever its sign (the
// CUDA host path; PTX does not specify the device cvt's NaN sign). -0.0 -> 0x80 (sign kept, like CUDA).
PL_HD uint8_t float_to_fp8(float x, int M, int B, uint32_t max_bits, uint32_t max_code) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (a > 0x7F800000u) return 0x7F;
  if (a > max_bits) return static_cast<uint8_t>(sign | max_code);
  return static_cast<uint8_t>(sign | round_to_minifloat_mag(a, M, B));
}

}  // namespace detail

// float -> E4M3 (bias 7, no Inf): |x| > 448 -> +-448 (0x7E / 0xFE), NaN -> 0x7F (detail::float_to_fp8).
PL_HD uint8_t float_to_e4m3(float x) { return detail::float_to_fp8(x, 3, 7, 0x43E00000u, 0x7Eu); }

// E4M3 -> float (exact). 0x7F / 0xFF -> NaN.
PL_HD float e4m3_to_float(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xFu;
  const uint32_t m = c & 0x7u;
  if ((c & 0x7Fu) == 0x7Fu) return bits_float(0x7FC00000u);
  if (e == 0) return bits_float(sign | float_bits(static_cast<float>(m) * 0x1p-9f));  // m * 2^-9, exact
  return bits_float(sign | ((e - 7u + 127u) << 23) | (m << 20));
}

// float -> E5M2 (bias 15): |x| > 57344 (+-Inf included) -> +-57344 (0x7B / 0xFB), NaN -> 0x7F.
PL_HD uint8_t float_to_e5m2(float x) { return detail::float_to_fp8(x, 2, 15, 0x47600000u, 0x7Bu); }

// E5M2 -> float (exact). 0x7C/0xFC -> +-Inf; 0x7D..0x7F (and negatives) -> NaN.
PL_HD float e5m2_to_float(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 2) & 0x1Fu;
  const uint32_t m = c & 0x3u;
  if (e == 31) return m == 0 ? bits_float(sign | 0x7F800000u) : bits_float(0x7FC00000u);
  if (e == 0) return bits_float(sign | float_bits(static_cast<float>(m) * 0x1p-16f));  // m * 2^-16
  return bits_float(sign | ((e - 15u + 127u) << 23) | (m << 21));
}

// float -> UE8M0 (a power of two 2^(e-127), e = 0..254; 0xFF = NaN), rounding UP, saturating to
// finite: the semantics of cvt.rp.satfinite.ue8m0x2.f32 and of cuda_fp8.hpp's host
// __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf):
//   result = the smallest e with 2^(e-127) >= |x|, clamped to [0x00, 0xFE];
//   |x| <= 2^-127 (including 0) -> 0x00 (2^-127, the format's minimum);
//   |x| > 2^127 and +-Inf -> 0xFE (2^127; satfinite);  NaN -> 0xFF.
// The sign is ignored (the host path converts |x|; block amaxes are never negative anyway).
PL_HD uint8_t float_to_ue8m0_rp(float x) {
  const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0xFF;
  if (a <= 0x00400000u) return 0x00;      // <= 2^-127
  uint32_t e = a >> 23;                   // biased float exponent; 0 for (2^-127, 2^-126)
  if (e == 0 || (a & 0x7FFFFFu) != 0) ++e;  // not an exact power of two (or subnormal): round up
  return static_cast<uint8_t>(e > 0xFEu ? 0xFEu : e);
}

// UE8M0 -> float: 2^(e-127) exactly (e = 0 -> 2^-127, a float subnormal); 0xFF -> NaN.
PL_HD float ue8m0_to_float(uint8_t e) {
  if (e == 0xFF) return bits_float(0x7FC00000u);
  if (e == 0) return bits_float(0x00400000u);
  return bits_float(static_cast<uint32_t>(e) << 23);
}

// ---- FP8 per-tensor current scaling (TE Float8CurrentScaling, SPEC-NVFP4 §5.3) -------------------
// scale = fp8_max / amax (one FP32 RN division, as __fdiv_rn); amax 0, +-Inf or NaN -> 1;
// a scale that overflows to Inf (tiny amax) -> FLT_MAX. (TE common/recipe/recipe_common.cuh:
// compute_scale_from_amax with epsilon 0 and no power-of-2 rounding.) scale_inv = 1/scale is the
// caller's (one FP32 RN division, as __frcp_rn). Codes: float_to_e4m3/e5m2(x * scale).
PL_HD float fp8_current_scale(float amax, float fp8_max) {
  const uint32_t a = float_bits(amax) & 0x7FFFFFFFu;
  if (a == 0 || a >= 0x7F800000u) return 1.0f;  // 0, Inf, NaN
  const float scale = fp8_max / amax;
  return (float_bits(scale) & 0x7FFFFFFFu) == 0x7F800000u ? FLT_MAX : scale;
}

// ---- MXFP8 (TE MXFP8BlockScaling, SPEC-NVFP4 §5.3) -----------------------------------------------
// Block scale of 32 elements: cvt.rp.satfinite.ue8m0(bamax * f32(1/448)) (one FP32 RN multiply by
// the FP32 constant 1/448 = 0x3B124925, then round up to a power of two).
PL_HD uint8_t mxfp8_block_scale(float block_amax) {
  const float kRcpE4M3Max = 0x1.24924ap-9f;  // f32(1/448), bits 0x3B124925
  return float_to_ue8m0_rp(block_amax * kRcpE4M3Max);
}

// Element scale of an MXFP8 block, as TE's exp2f_rcp (common/util/ptx.cuh / utils.cuh, read at
// NVIDIA/TransformerEngine HEAD): 2^(127-e) built from bits, with TE's two edge cases kept so that
// codes match TE bit for bit: e == 0 gives 1.0 (not 2^127) and e == 254 gives 0.0 (the bit pattern
// (254-e)<<23). e == 0 only occurs for blocks with bamax <= 448*2^-127 (all-zero blocks or values
// below ~7.6e-36, which therefore quantize to ~0, as in TE). 0xFF (a NaN block) gives NaN here
// (TE: the bit pattern of -Inf); the codes of such a block are NaN/saturated either way.
PL_HD float mxfp8_element_scale(uint8_t e) {
  if (e == 0xFF) return bits_float(0x7FC00000u);
  if (e == 0) return 1.0f;
  return bits_float(static_cast<uint32_t>(254u - e) << 23);
}

}  // namespace pl::num
