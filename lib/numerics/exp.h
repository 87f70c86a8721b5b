#pragma once
// exp_f32: an FP32 exponential both backends evaluate with the same FP32 operations in the same order,
// so the CPU and the GPU get the same bits for the same argument (the CPU's std::exp and CUDA's expf
// differ by up to 2 ulp). It is branch-free straight-line code, so a CPU loop calling it vectorizes
// (a libm call per element does not), and it is what cross-entropy and SwiGLU use on both backends.
//
// Method (Cody and Waite's argument reduction, "Software Manual for the Elementary Functions", 1980):
//   x is clamped to [-104, 89] (exp(-104) < 2^-150 rounds to +0, exp(89) overflows to +Inf, so the
//   clamp changes no result); n = round(x / ln 2) by the 1.5 * 2^23 shifter; r = x - n ln2_hi - n ln2_lo
//   with ln2_hi holding 16 significant bits (n ln2_hi is exact for |n| <= 256), so |r| <= ~0.347;
//   e^r by its degree-7 Taylor polynomial in Horner form (truncation < r^8/8! ~ 5e-9 relative);
//   2^n applied as two exact power-of-two factors 2^(n>>1) and 2^(n - (n>>1)), each a normal float for
//   n in [-150, 128], so results in the subnormal range are rounded once, as a correctly rounded exp's.
// Multiplies and adds only, no fmaf: the x86-64 baseline has no FMA instruction (fmaf there is a libm
// call that blocks vectorization), and both builds disable contraction (-ffp-contract=off, nvcc
// --fmad=false), so the evaluation order written here is the one executed everywhere.
// Accuracy, measured against glibc's expf (correctly rounded in practice) over every float in
// [-104, 89] (2.24e9 arguments): at most 1 ulp, and 99.2% of the results identical; the strided sweep in
// tests/numerics/test_exp.cpp checks that bound.
// NaN in -> NaN out; -Inf -> +0; +Inf -> +Inf.
#include <cstdint>

#include "numerics/bf16.h"
#include "numerics/hd.h"

namespace pl::num {

PL_HD float exp_f32(float x) {
  constexpr float kLog2e = 1.44269502162933349609375f;     // 0x1.715476p+0, 1/ln 2 rounded
  constexpr float kLn2Hi = 0.693145751953125f;             // 0x1.62e4p-1: ln 2 to 16 significant bits
  constexpr float kLn2Lo = 1.428606765330187045e-06f;      // ln 2 - kLn2Hi, rounded to float
  constexpr float kShifter = 12582912.0f;                  // 1.5 * 2^23: adding it rounds to an integer
  x = x < -104.0f ? -104.0f : x;  // NaN compares false and passes through both clamps
  x = x > 89.0f ? 89.0f : x;
  const float shifted = x * kLog2e + kShifter;                 // 1.5 * 2^23 + n, n = round(x log2 e)
  const float n = shifted - kShifter;                          // exact
  const int32_t ni = static_cast<int32_t>(float_bits(shifted) - 0x4B400000u);  // n as an integer
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t n1 = ni >> 1, n2 = ni - n1;  // both in [-75, 64] for the clamped range
  const float s1 = bits_float((static_cast<uint32_t>(n1) + 127u) << 23);
  const float s2 = bits_float((static_cast<uint32_t>(n2) + 127u) << 23);
  return (p * s1) * s2;
}

}  // namespace pl::num
