#pragma once
// FP8 delayed scaling (Transformer Engine's DelayedScaling recipe): the scale of a tensor comes from
// the amaxes of its previous steps, kept in an amax history, and is updated after each step. Shared
// by the CPU op and the CUDA kernel (delayed_scaling_update, backend/op_list.h): same bits on both.
//
// Followed (NVIDIA/TransformerEngine, read at HEAD d0067d0):
//   transformer_engine/common/recipe/delayed_scaling.cu, amax_and_scale_update_impl::kernel_bulk (the
//   fused update every PyTorch run takes unless NVTE_UNFUSED_FP8_UPDATE=1), called by
//   transformer_engine/pytorch/quantization.py, FP8GlobalStateManager::reduce_and_update_fp8_tensors.
// History layout as TE's amax_history: [len, n] row-major, row 0 the current step's amaxes (the
// quantizer writes amax(x) there), rows 1..len-1 the previous ones, oldest first.
// One update of tensor j (last = h[0][j], after the data-parallel MAX reduction, if any):
//   - last != 0: roll. m = max(h[1..len-1][j], last) (fmaxf: NaN ignored); the new history is
//     [0, h[2], ..., h[len-1], last] (h[1], the oldest, leaves; row 0 cleared for the next step).
//     last == 0 (the tensor was not quantized this step, e.g. a weight after the first micro-batch):
//     no roll and m = 0, so the scale is kept.
//   - "most_recent": m = last instead.
//   - scale = (m finite and > 0) ? scaled_max / m : the previous scale; an Inf result (tiny m) -> FLT_MAX.
//     scaled_max = fp8_max * 2^-margin (delayed_scaling.cu, amax_and_scale_update_after_reduction).
// Initial state (TE's fp8 meta init): history all zeros and scale 1, so the first step quantizes with
// scale 1 and its amax gives the second step's scale. scale_inv = 1/scale is taken by the quantizer when
// it uses the scale (TE's cast kernels), not stored here.
#include <cfloat>
#include <cstdint>

#include "numerics/bf16.h"  // float_bits
#include "numerics/hd.h"

namespace pl::num {

// fp8_max * 2^-margin, exact (a power-of-two product; margin >= 0 as the flags check).
PL_HD float delayed_scaled_max(float fp8_max, int margin) {
  float s = fp8_max;
  for (int i = 0; i < margin; ++i) s *= 0.5f;
  return s;
}

// The new scale from the amax m chosen from the history and the previous scale.
PL_HD float delayed_scale_from_amax(float m, float previous, float scaled_max) {
  const bool finite_positive = m > 0.0f && (float_bits(m) & 0x7FFFFFFFu) < 0x7F800000u;
  const float scale = finite_positive ? scaled_max / m : previous;
  return (float_bits(scale) & 0x7FFFFFFFu) == 0x7F800000u ? FLT_MAX : scale;
}

// fmaxf's rule (a NaN operand gives the other one), spelled out so host and device agree.
PL_HD float delayed_fmax(float a, float b) {
  if (b != b) return a;
  if (a != a) return b;
  return a > b ? a : b;
}

// One update of tensor j of a history [len, n] (element (i, j) at h[i * n + j]) and its scale.
PL_HD void delayed_scaling_update_one(float* h, int64_t len, int64_t n, int64_t j, float* scale, bool most_recent,
                                      float scaled_max) {
  const float last = h[j];
  float m = 0.0f;
  if (last != 0.0f) {
    for (int64_t i = 0; i < len; ++i) {
      const float a = i < len - 1 ? h[(i + 1) * n + j] : last;
      m = delayed_fmax(m, a);
      h[i * n + j] = i > 0 ? a : 0.0f;
    }
  }
  if (most_recent) m = last;
  *scale = delayed_scale_from_amax(m, *scale, scaled_max);
}

}  // namespace pl::num
