#pragma once
// SwiGLU of one element, forward and backward, shared by the CPU and CUDA backends. The exponential is
// num::exp_f32 (numerics/exp.h), the same FP32 operations on both sides, and the rest is IEEE multiplies,
// adds and divides with contraction off on both sides, so the backends agree bit for bit (until issue 25
// each called its own expf: glibc's and CUDA's, up to 2 ulp apart). exp_f32 is within 1 ulp of glibc's.
#include "numerics/exp.h"
#include "numerics/hd.h"

namespace pl::num {

PL_HD float sigmoid(float g) { return 1.0f / (1.0f + exp_f32(-g)); }

// silu(gate) * up, with silu(g) = g / (1 + exp(-g)).
PL_HD float swiglu(float gate, float up) { return gate / (1.0f + exp_f32(-gate)) * up; }

// Gradients of swiglu(gate, up) given the output gradient dout:
//   d/dgate = dout * up * sig * (1 + g * (1 - sig)),   d/dup = dout * silu(g).
PL_HD void swiglu_backward(float gate, float up, float dout, float& dgate, float& dup) {
  const float sig = sigmoid(gate);
  const float silu = gate * sig;
  dgate = dout * up * (sig * (1.0f + gate * (1.0f - sig)));
  dup = dout * silu;
}

}  // namespace pl::num
