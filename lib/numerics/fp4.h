#pragma once
// FP4 E2M1 conversions: round-to-nearest-even (cvt.rn.satfinite.e2m1x2.f32) and TE's portable
// stochastic-rounding rule (SPEC-NVFP4 §1.1, §4). Codes are one nibble: bit 3 = sign, then
// e1 e0 m (bias 1): 0, 0.5, 1, 1.5, 2, 3, 4, 6. No Inf/NaN; code 8 is -0.
#include <cmath>
#include <cstdint>

#include "numerics/bf16.h"  // float_bits / bits_float
#include "numerics/fp8.h"   // detail::round_to_minifloat_mag
#include "numerics/hd.h"

namespace pl::num {

constexpr float kE2M1Max = 6.0f;

// float -> E2M1, RNE on the grid with ties to the even code (0.25->0, 0.75->1, 1.25->1, 1.75->2,
// 2.5->2, 3.5->4, 5->4), saturating: |x| > 6 (including +-Inf) -> +-6 (0x7 / 0xF).
// NaN -> 0x7 (+6), as the PTX cvt and cuda_fp4.hpp. The sign is kept for results that round to zero
// (-0.0, -0.1 -> 0x8), as the kernels and cuda_fp4.hpp do (TE's PyTorch reference would give 0; we
// follow the kernels, SPEC-NVFP4 §1.1).
PL_HD uint8_t float_to_e2m1(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7;
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  if (a > 0x40C00000u) return static_cast<uint8_t>(sign | 0x7u);  // > 6
  return static_cast<uint8_t>(sign | detail::round_to_minifloat_mag(a, 1, 1));
}

// E2M1 code (low nibble; high bits ignored) -> float, exact. Code 8 -> -0.0f.
PL_HD float e2m1_to_float(uint8_t code) {
  const uint32_t c = code & 0xFu;
  const uint32_t mag = c & 0x7u;
  // 0, 0.5, 1, 1.5, 2, 3, 4, 6 as bits: exponent field 0 is subnormal (m * 0.5).
  const uint32_t e = mag >> 1, m = mag & 1u;
  const uint32_t bits = (e == 0) ? (m ? 0x3F000000u : 0u) : (((e - 1u + 127u) << 23) | (m << 22));
  return bits_float(((c & 0x8u) << 28) | bits);
}

// Stochastic rounding to E2M1 with 8 random bits: TE's portable emulation of cvt.rs.satfinite.e2m1x4
// (transformer_engine common/util/ptx.cuh: stochastic_round_fp4_e2m1, PR #3281; SPEC-NVFP4 §4):
//   u = rbits/256; a = |x|; step(v) = 0.5 if v < 2, 1 if v < 4, else 2;
//   t = fmaf(u, step(a), a); q = min(floor(t / step(t)) * step(t), 6); result = copysign(q, x).
// TE uses fmaf; so do we, on both sides: the IEEE fused operation, correctly rounded, so host and device
// agree bit for bit, and as a call no compiler setting (-ffp-contract=off, --fmad=false) can change it.
// Since u has 8 bits and step is a power of two, u*step is exact, so the fused and unfused forms agree anyway.
// t/step(t) is a division by a power of two (exact), floor is exact. The rounding goes up with
// probability (distance to the lower grid point)/step, so the result is unbiased: for in-range x on a
// step/256 grid the mean over all 256 rbits values equals x exactly. |x| >= 6 and +-Inf -> +-6;
// NaN -> 0x7 (+6, as the hardware cvt). Zero results keep the sign of x (code 8 for x < 0), as E2M1().
// Statistically equivalent to, not bit-identical with, the hardware cvt.rs (SPEC-NVFP4 §4).
PL_HD uint8_t float_to_e2m1_sr(float x, uint8_t rbits) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7;
  const float a = bits_float(u & 0x7FFFFFFFu);
  const float r = static_cast<float>(rbits) * 0x1p-8f;  // exact
  const float step_a = a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f);
  const float t = fmaf(r, step_a, a);
  const float step_t = t < 2.0f ? 0.5f : (t < 4.0f ? 1.0f : 2.0f);
  float q = floorf(t / step_t) * step_t;
  if (!(q < 6.0f)) q = 6.0f;  // min(q, 6); q is never NaN here
  // q is exactly one of 0, 0.5, ..., 6, so the RN conversion is exact and just encodes it.
  return static_cast<uint8_t>(((u >> 28) & 0x8u) | float_to_e2m1(q));
}

}  // namespace pl::num
