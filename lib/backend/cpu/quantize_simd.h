#pragma once
// Branch-free twins of the per-element numerics in lib/numerics/ (fp4.h, fp8.h), for the CPU
// quantizers' vectorized loops (quantize_tile.cpp): every function returns exactly what its twin
// returns for every input (tests/ops/test_quantize.cpp compares whole copies with the twins), but is
// written as selects over integer and FP32 operations that the compiler turns into SIMD lanes: no
// branches, no libm calls, no variable shifts. Codes are returned as uint32_t (the byte in the low
// bits), so a loop over them keeps one element width and fills whole vector registers. CPU only; the
// CUDA kernels keep the originals.
#include <cfloat>
#include <cstdint>

#include "numerics/bf16.h"

namespace pl::cpu::simd {

using num::bits_float;
using num::float_bits;

// c ? a : b as bit masks: GCC keeps this a select in every lane, where it turns chains of ternaries
// into branches (jump threading) that stop the loop from vectorizing.
inline uint32_t sel(bool c, uint32_t a, uint32_t b) { return b ^ ((a ^ b) & (0u - static_cast<uint32_t>(c))); }

// |x|'s bits with NaN mapped to 0: for non-negative floats the integer order is the float order, so a
// max over these is fmaxf's max |x| with NaN ignored and Inf kept (the kernels' amax).
inline uint32_t abs_bits_nan0(float x) {
  const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  return sel(a > 0x7F800000u, 0u, a);
}

// num::detail::float_to_fp8 and num::float_to_e2m1: a minifloat with M mantissa bits and bias B, RN
// even, saturating to max_code above max_bits, NaN -> nan_code, sign kept otherwise (sign_shift moves
// bit 31 to the format's sign bit). Normal results round on the float bits as round_to_minifloat_mag
// does. Subnormal results: adding 2^(24-B-M) (whose ulp is the format's quantum 2^(1-B-M)) to |x| <
// 2^(1-B) makes one FP32 RN addition round |x| to a whole number of quanta, ties to even; that number
// is the code (the float subnormal and far-below-quantum cases give 0, as there). The sum is a normal
// float, so flush-to-zero modes cannot change it.
template <int M, int B>
inline uint32_t minifloat_rn_mag(uint32_t a) {
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(127 + 1 - B) << 23;
  constexpr int kDrop = 23 - M;
  constexpr uint32_t kMagic = static_cast<uint32_t>(127 + 24 - B - M) << 23;  // 2^(24-B-M)
  const uint32_t normal = ((a + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u)) >> kDrop) -
                          (static_cast<uint32_t>(127 - B) << M);
  const uint32_t sub = float_bits(bits_float(a) + bits_float(kMagic)) - kMagic;
  return sel(a >= kMinNormal, normal, sub);
}

template <int M, int B, uint32_t kMaxBits, uint32_t kMaxCode, uint32_t kNanCode, int kSignShift>
inline uint32_t float_to_minifloat(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t sign = (u >> kSignShift) & (1u << (31 - kSignShift));
  const bool big = a > kMaxBits;
  const uint32_t mag = sel(big, kMaxCode, minifloat_rn_mag<M, B>(sel(big, 0u, a)));  // 0: keeps the add finite
  return sel(a > 0x7F800000u, kNanCode, sign | mag);
}

inline uint32_t float_to_e4m3(float x) { return float_to_minifloat<3, 7, 0x43E00000u, 0x7Eu, 0x7Fu, 24>(x); }
inline uint32_t float_to_e5m2(float x) { return float_to_minifloat<2, 15, 0x47600000u, 0x7Bu, 0x7Fu, 24>(x); }
inline uint32_t float_to_e2m1(float x) { return float_to_minifloat<1, 1, 0x40C00000u, 0x7u, 0x7u, 28>(x); }

// num::e4m3_to_float: subnormal codes m * 2^-9 (exact), 0x7F / 0xFF NaN.
inline float e4m3_to_float(uint32_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xFu;
  const uint32_t m = c & 0x7u;
  const uint32_t sub = float_bits(static_cast<float>(static_cast<int32_t>(m)) * 0x1p-9f);
  const uint32_t normal = ((e + 120u) << 23) | (m << 20);
  const uint32_t bits = sign | sel(e == 0, sub, normal);
  return bits_float(sel((c & 0x7Fu) == 0x7Fu, 0x7FC00000u, bits));
}

// num::float_to_e2m1_sr (TE's portable SR rule, fp4.h). a + r * step_a is one RN addition there too
// (the product is exact, so fmaf and the unfused form agree). floor(t / step_t) for 0 <= t < 6 is a
// truncating conversion (t / step_t < 12 is exact); t >= 6 (Inf included) gives 6 as min(q, 6) does.
inline uint32_t e2m1_sr_step_bits(uint32_t v) {  // step(v) for v >= 0 given by its bits (Inf: 2)
  return sel(v < 0x40000000u, 0x3F000000u, sel(v < 0x40800000u, 0x3F800000u, 0x40000000u));  // 0.5, 1, 2
}
inline uint32_t float_to_e2m1_sr(float x, uint32_t rbits) {
  const uint32_t u = float_bits(x);
  const uint32_t abits = u & 0x7FFFFFFFu;
  const uint32_t a_in = sel(abits > 0x7F800000u, 0u, abits);
  const float r = static_cast<float>(static_cast<int32_t>(rbits)) * 0x1p-8f;
  const float t = bits_float(a_in) + r * bits_float(e2m1_sr_step_bits(a_in));
  const uint32_t tb = float_bits(t);
  const bool below6 = tb < 0x40C00000u;
  const float t_in = bits_float(sel(below6, tb, 0u));  // keeps the conversion in range
  const float step_t = bits_float(e2m1_sr_step_bits(tb));
  const float q_in = static_cast<float>(static_cast<int32_t>(t_in / step_t)) * step_t;
  const uint32_t q = sel(below6, float_bits(q_in), 0x40C00000u);
  // q is on the E2M1 grid, so its RN code is its code.
  const uint32_t code = ((u >> 28) & 0x8u) | minifloat_rn_mag<1, 1>(q);
  return sel(abits > 0x7F800000u, 0x7u, code);
}

// num::float_to_ue8m0_rp: the smallest 2^(e-127) >= |x|, clamped to [0x00, 0xFE]; NaN -> 0xFF.
inline uint32_t float_to_ue8m0_rp(float x) {
  const uint32_t a = float_bits(x) & 0x7FFFFFFFu;
  const uint32_t e0 = a >> 23;
  const uint32_t e = e0 + static_cast<uint32_t>(e0 == 0 || (a & 0x7FFFFFu) != 0);
  const uint32_t clamped = sel(e > 0xFEu, 0xFEu, e);
  const uint32_t res = sel(a <= 0x00400000u, 0u, clamped);
  return sel(a > 0x7F800000u, 0xFFu, res);
}

// num::mxfp8_element_scale: 2^(127-e) from bits, e == 0 -> 1, 0xFF -> NaN.
inline float mxfp8_element_scale(uint32_t e) {
  const uint32_t bits = (254u - e) << 23;
  const uint32_t r = sel(e == 0, 0x3F800000u, bits);
  return bits_float(sel(e == 0xFF, 0x7FC00000u, r));
}

// fminf(x, FLT_MAX) (NaN -> FLT_MAX, as fminf drops the NaN).
inline float min_flt_max(float x) { return bits_float(sel(x < FLT_MAX, float_bits(x), float_bits(FLT_MAX))); }

}  // namespace pl::cpu::simd
