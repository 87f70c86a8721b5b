// CPU token embedding. Forward gathers rows (OpenMP over tokens). Backward scatters dout into the
// FP32 accumulator dtable deterministically: threads own disjoint column blocks of the hidden
// dimension and each walks all tokens in order, so every dtable element receives its contributions
// in token order, whatever the thread count, with no atomics.
#include <algorithm>

#include "backend/cpu/cpu_ops.h"
#include "numerics/bf16.h"

namespace pl::cpu {

void embedding_forward(const OpContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table) {
  const int64_t T = out.dim(0), h = out.dim(1);
  const int32_t* tok = tokens.i32();
  const float* tab = table.f32();
  float* o = out.f32();
  const bool round = ctx.round_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* src = tab + static_cast<int64_t>(tok[t]) * h;
    float* dst = o + t * h;
    for (int64_t c = 0; c < h; ++c) dst[c] = round ? num::round_bf16(src[c]) : src[c];
  }
}

void embedding_backward(const OpContext& ctx, const Tensor& dtable, const Tensor& dout,
                        const Tensor& tokens) {
  (void)ctx;  // dtable is an FP32 accumulator: never rounded
  const int64_t T = dout.dim(0), h = dout.dim(1);
  const int32_t* tok = tokens.i32();
  const float* g = dout.f32();
  float* dt = dtable.f32();
  const int64_t blocks = (h + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kColumnBlock, c1 = std::min(h, c0 + kColumnBlock);
    for (int64_t t = 0; t < T; ++t) {
      float* dst = dt + static_cast<int64_t>(tok[t]) * h;
      const float* src = g + t * h;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace pl::cpu
