#pragma once
// SwiGLU of one element, forward and backward, shared by the CPU and CUDA backends. The only
// difference between backends is expf itself (glibc's is correctly rounded to within 0.5 ulp,
// CUDA's within 2 ulp), so results agree to a few float ulps, not bit for bit.
#include <cmath>

#include "numerics/hd.h"

namespace pl::num {

PL_HD float sigmoid(float g) {
#if defined(__CUDA_ARCH__)
  return 1.0f / (1.0f + expf(-g));
#else
  return 1.0f / (1.0f + std::exp(-g));
#endif
}

// silu(gate) * up, with silu(g) = g / (1 + exp(-g)).
PL_HD float swiglu(float gate, float up) {
#if defined(__CUDA_ARCH__)
  return gate / (1.0f + expf(-gate)) * up;
#else
  return gate / (1.0f + std::exp(-gate)) * up;
#endif
}

// Gradients of swiglu(gate, up) given the output gradient dout:
//   d/dgate = dout * up * sig * (1 + g * (1 - sig)),   d/dup = dout * silu(g).
PL_HD void swiglu_backward(float gate, float up, float dout, float& dgate, float& dup) {
  const float sig = sigmoid(gate);
  const float silu = gate * sig;
  dgate = dout * up * (sig * (1.0f + gate * (1.0f - sig)));
  dup = dout * silu;
}

}  // namespace pl::num
