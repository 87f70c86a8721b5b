// CPU SwiGLU: fc1[T, 2f] = [gate | up] along the last dimension, out = silu(gate) * up with
// silu(g) = g / (1 + exp(-g)). All math in fp32, OpenMP over rows; out and dfc1 are bf16 activations
// (rounded when ctx.round_bf16).
#include "backend/cpu/cpu_ops.h"
#include "numerics/bf16.h"
#include "numerics/swiglu.h"

namespace pl::cpu {
void swiglu_forward(const OpContext& ctx, const Tensor& out, const Tensor& fc1) {
  const int64_t T = out.dim(0), f = out.dim(1);
  const float* in = fc1.f32();
  float* o = out.f32();
  const bool round = ctx.round_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* gate = in + t * 2 * f;
    const float* up = gate + f;
    float* orow = o + t * f;
    for (int64_t i = 0; i < f; ++i) {
      const float v = num::swiglu(gate[i], up[i]);
      orow[i] = round ? num::round_bf16(v) : v;
    }
  }
}

void swiglu_backward(const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1) {
  const int64_t T = dout.dim(0), f = dout.dim(1);
  const float* in = fc1.f32();
  const float* go = dout.f32();
  float* d = dfc1.f32();
  const bool round = ctx.round_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* gate = in + t * 2 * f;
    const float* up = gate + f;
    const float* grow = go + t * f;
    float* dgate = d + t * 2 * f;
    float* dup = dgate + f;
    for (int64_t i = 0; i < f; ++i) {
      float vg, vu;
      num::swiglu_backward(gate[i], up[i], grow[i], vg, vu);
      dgate[i] = round ? num::round_bf16(vg) : vg;
      dup[i] = round ? num::round_bf16(vu) : vu;
    }
  }
}

}  // namespace pl::cpu
