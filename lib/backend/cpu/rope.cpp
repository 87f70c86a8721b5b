// CPU rotary position embedding, rotate-half (non-interleaved, as in HF Llama): for pair i < d/2 of
// a head, (x_i, x_{i+d/2}) at angle θ = angle(position, i) (position: the token's TokenPositions entry, or
// t % seq_len without them) becomes
//   (x_i cos θ - x_{i+d/2} sin θ,  x_{i+d/2} cos θ + x_i sin θ).
// The backward applies the transposed rotation (angle -θ). Both work in place on the first
// rotated_heads heads of every row of qkv, OpenMP over rows; results are rounded to bf16 when
// ctx.round_bf16 (qkv and dqkv are bf16 activations).
#include "backend/cpu/cpu_ops.h"
#include "numerics/bf16.h"

namespace pl::cpu {
namespace {
// sign = +1: forward rotation by θ; sign = -1: rotation by -θ (the adjoint).
void rotate(const OpContext& ctx, const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t seq_len,
            int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions, float sign) {
  const int64_t T = qkv.dim(0), width = qkv.dim(1), half = head_dim / 2;
  const float* cp = cos.f32();
  const float* sp = sin.f32();
  float* base = qkv.f32();
  const bool round = ctx.round_bf16;
  const int32_t* given = positions.host;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = given != nullptr ? given[t] : t % seq_len;
    const float* c = cp + pos * half;
    const float* s = sp + pos * half;
    float* row = base + t * width;
    for (int64_t hd = 0; hd < rotated_heads; ++hd) {
      float* x = row + hd * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        const float sn = sign * s[i];
        const float y1 = x1 * c[i] - x2 * sn, y2 = x2 * c[i] + x1 * sn;
        x[i] = round ? num::round_bf16(y1) : y1;
        x[i + half] = round ? num::round_bf16(y2) : y2;
      }
    }
  }
}

}  // namespace

void rope_forward(const OpContext& ctx, const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                  int64_t seq_len, int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions) {
  rotate(ctx, qkv, cos, sin, seq_len, rotated_heads, head_dim, positions, 1.0f);
}

void rope_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& cos, const Tensor& sin,
                   int64_t seq_len, int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions) {
  rotate(ctx, dqkv, cos, sin, seq_len, rotated_heads, head_dim, positions, -1.0f);
}

}  // namespace pl::cpu
