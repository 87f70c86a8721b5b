#pragma once
// SwiGLU of one element, forward and backward, shared by the CPU and CUDA backends. The only
// difference between backends is expf itself (glibc's is correctly rounded to within 0.5 ulp,
// CUDA's within 2 ulp), so results agree to a few float ulps, not bit for bit.
#include <cmath>

#include "numerics/hd.h"

namespace pl::num {

// expf on both sides: the host's is glibc's (std::exp(float) calls the same function).
PL_HD float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// silu(gate) * up, with silu(g) = g / (1 + exp(-g)).
PL_HD float swiglu(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

// Gradients of swiglu(gate, up) given the output gradient dout:
//   d/dgate = dout * up * sig * (1 + g * (1 - sig)),   d/dup = dout * silu(g).
PL_HD void swiglu_backward(float gate, float up, float dout, float& dgate, float& dup) {
  const float sig = sigmoid(gate);
  const float silu = gate * sig;
  dgate = dout * up * (sig * (1.0f + gate * (1.0f - sig)));
  dup = dout * silu;
}

}  // namespace pl::num
