#pragma once
// Philox4x32-10 counter-based RNG (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the Random123 library's philox4x32 with R = 10) and the stochastic-rounding bit stream
// built on it. Same bits on host and device: only 32/64-bit integer arithmetic.
#include <cstdint>

#include "numerics/hd.h"

namespace pl::num {

// Random123 constants (philox.h: PHILOX_M4x32_0/1, PHILOX_W32_0/1).
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1

// One Philox4x32 round: (hi, lo) = M * x as a 64-bit product.
//   out = { hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0) }
PL_HD void philox4x32_round(uint32_t c[4], const uint32_t k[2]) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c[2];
  const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  const uint32_t c1 = c[1], c3 = c[3];
  c[0] = hi1 ^ c1 ^ k[0];
  c[1] = lo1;
  c[2] = hi0 ^ c3 ^ k[1];
  c[3] = lo0;
}

// Philox4x32-10: ten rounds, the key bumped by (W0, W1) between rounds (the first round uses the key
// as given). Checked against Random123's known-answer vectors (tests/numerics/test_philox.cpp).
PL_HD void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c[4] = {counter[0], counter[1], counter[2], counter[3]};
  uint32_t k[2] = {key[0], key[1]};
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    philox4x32_round(c, k);
  }
  for (int i = 0; i < 4; ++i) out[i] = c[i];
}

// ---- stochastic-rounding bits --------------------------------------------------------------------
// The 8 random bits of element `element` of a quantized copy come from one Philox4x32-10 call per 16
// consecutive elements (block b = element / 16; byte k = element % 16 of the 128-bit output, i.e.
// (out[k/4] >> (8*(k%4))) & 0xFF):
//   key     = { uint32(seed), uint32(seed >> 32) }
//   counter = { uint32(b), uint32(b >> 32) ^ uint32(counter >> 32), stream_id, uint32(counter) }
// The high half of `counter` is folded into word 1 by XOR, so the map (b, stream_id, counter) ->
// Philox counter is injective whenever b < 2^32 (fewer than 2^36 elements per copy) or counter < 2^32.
// Streams: `stream_id` separates tensors/copies within one step, `counter` separates steps/calls.
// This is our own stream (SPEC-NVFP4 project decision); it does not reproduce TE's SR bits.
PL_HD void sr_random_words(uint64_t seed, uint32_t stream_id, uint64_t counter, uint64_t block_index,
                           uint32_t out[4]) {
  const uint32_t ctr[4] = {static_cast<uint32_t>(block_index),
                           static_cast<uint32_t>(block_index >> 32) ^ static_cast<uint32_t>(counter >> 32),
                           stream_id, static_cast<uint32_t>(counter)};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  philox4x32_10(ctr, key, out);
}

PL_HD void sr_random_bytes16(uint64_t seed, uint32_t stream_id, uint64_t counter, uint64_t block_index,
                             uint8_t out[16]) {
  uint32_t r[4];
  sr_random_words(seed, stream_id, counter, block_index, r);
  for (int k = 0; k < 16; ++k) out[k] = static_cast<uint8_t>(r[k / 4] >> (8 * (k % 4)));
}

// The random byte of one element (== sr_random_bytes16(seed, stream_id, counter, element/16)[element%16]).
PL_HD uint8_t sr_random_byte(uint64_t seed, uint32_t stream_id, uint64_t counter, uint64_t element) {
  uint32_t r[4];
  sr_random_words(seed, stream_id, counter, element / 16, r);
  const uint32_t k = static_cast<uint32_t>(element % 16);
  return static_cast<uint8_t>(r[k / 4] >> (8 * (k % 4)));
}

}  // namespace pl::num
