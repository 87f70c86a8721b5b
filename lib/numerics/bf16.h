#pragma once
// BF16 <-> FP32 conversions, bit-exact with cuda_bf16.h's __float2bfloat16_rn / __bfloat162float
// for every input: round-to-nearest-even, overflow -> +-Inf, every NaN -> 0x7FFF (CUDA's canonical NaN).
#include <cstdint>
#include <cstring>

#include "numerics/hd.h"

namespace pl::num {

PL_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

PL_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// float -> bf16 bits, round to nearest, ties to even.
PL_HD uint16_t float_to_bf16_bits(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;  // NaN
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7FFFu + lsb) >> 16);
}

PL_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// The value a BF16 store of x would hold, as a float. The CPU backend keeps BF16 tensors in FP32
// storage holding exactly these values, so BLAS can consume them directly.
PL_HD float round_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

}  // namespace pl::num
