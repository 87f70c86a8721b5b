#pragma once
// BF16 <-> FP32 conversions, bit-exact with cuda_bf16.h's __float2bfloat16_rn / __bfloat162float
// for every input: round-to-nearest-even, overflow -> +-Inf, every NaN -> 0x7FFF (CUDA's canonical NaN).
#include <cstdint>

#include "numerics/hd.h"

namespace pl::num {

// The bits of a float and back. __builtin_bit_cast (GCC, Clang, nvcc host and device) rather than
// std::bit_cast: the header is also compiled as CUDA C++17.
PL_HD uint32_t float_bits(float x) { return __builtin_bit_cast(uint32_t, x); }
PL_HD float bits_float(uint32_t u) { return __builtin_bit_cast(float, u); }

// float -> bf16 bits, round to nearest, ties to even. Branch-free (a select, not an early return for NaN) so
// loops over it vectorize: the CPU backend rounds every bf16 activation with it.
PL_HD uint16_t float_to_bf16_bits(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? 0x7FFFu : rounded);  // NaN -> 0x7FFF
}

PL_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// The value a BF16 store of x would hold, as a float. The CPU backend keeps BF16 tensors in FP32
// storage holding exactly these values, so BLAS can consume them directly.
PL_HD float round_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

}  // namespace pl::num
