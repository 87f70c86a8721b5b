#pragma once
// Dropout's keep mask from the counter-based Philox stream (philox.h), so the backward regenerates the
// forward's mask from (seed, stream, counter) instead of storing it (issue 41: LoRA's adapter dropout).
//
// Element i of a call keeps its value when the 32-bit word (i % 4) of one Philox4x32-10 call per 4
// consecutive elements is >= the threshold uint32(p · 2^32):
//   key     = { uint32(seed), uint32(seed >> 32) }
//   counter = { uint32(i / 4), uint32((i / 4) >> 32) ^ uint32(counter >> 32), stream_id, uint32(counter) }
// (the stochastic-rounding counter layout of philox.h, with 4 elements per call instead of 16), so the keep
// probability is 1 - threshold / 2^32, p to within 2^-32. A kept value is scaled by 1 / (1 - p) as PyTorch's
// inverted dropout does (the scale computed once in FP32, the product rounded once by the caller's storage).
// This is our own stream: it does not reproduce PyTorch's masks (its Philox offsets are its own).
#include <cstdint>

#include "numerics/hd.h"
#include "numerics/philox.h"

namespace pl::num {

// The drop threshold of probability p in [0, 1): p · 2^32 (exact in FP32, a power-of-two scaling), truncated.
PL_HD uint32_t dropout_threshold(float p) { return p <= 0.0f ? 0u : static_cast<uint32_t>(p * 4294967296.0f); }
// The scale of a kept value: 1 / (1 - p) in FP32.
PL_HD float dropout_scale(float p) { return 1.0f / (1.0f - p); }

// The four Philox words of elements 4q .. 4q + 3 of a call.
PL_HD void dropout_words(uint64_t seed, uint32_t stream_id, uint64_t counter, uint64_t quad, uint32_t out[4]) {
  const uint32_t ctr[4] = {static_cast<uint32_t>(quad),
                           static_cast<uint32_t>(quad >> 32) ^ static_cast<uint32_t>(counter >> 32), stream_id,
                           static_cast<uint32_t>(counter)};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  philox4x32_10(ctr, key, out);
}

// Whether element i is kept (threshold: dropout_threshold(p)).
PL_HD bool dropout_keeps(uint64_t seed, uint32_t stream_id, uint64_t counter, uint64_t i, uint32_t threshold) {
  uint32_t w[4];
  dropout_words(seed, stream_id, counter, i / 4, w);
  return w[i % 4] >= threshold;
}

// The value dropout makes of x: x · scale when kept, else x · 0 (a signed zero; NaN stays NaN, as PyTorch's
// x · mask · scale), in FP32; the caller rounds it to its storage.
PL_HD float dropout_value(float x, bool kept, float scale) { return x * (kept ? scale : 0.0f); }

}  // namespace pl::num
