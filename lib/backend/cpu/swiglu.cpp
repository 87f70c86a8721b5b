// CPU SwiGLU: fc1[T, 2f] = [gate | up] along the last dimension, out = silu(gate) * up with
// silu(g) = g / (1 + exp(-g)) (numerics/swiglu.h, exp by num::exp_f32: bit-identical with the CUDA
// backend). All math in fp32, OpenMP over rows, one vectorized function per row; out and dfc1 are bf16
// activations (rounded when ctx.round_bf16). out_amax / dfc1_amax: each row's max |v| after the row is
// written, combined by max (order-independent, NaN ignored).
#include <algorithm>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quantize_tile.h"  // contiguous_amax: the quantizer's own amax rule
#include "backend/cpu/vector_clones.h"
#include "numerics/bf16.h"
#include "numerics/swiglu.h"

namespace pl::cpu {
namespace {
template <bool Round>
PL_VECTOR_CLONES void forward_row(float* __restrict out, const float* __restrict gate, const float* __restrict up,
                                  int64_t f) {
  for (int64_t i = 0; i < f; ++i) {
    const float v = num::swiglu(gate[i], up[i]);
    out[i] = Round ? num::round_bf16(v) : v;
  }
}

template <bool Round>
PL_VECTOR_CLONES void backward_row(float* __restrict dgate, float* __restrict dup, const float* __restrict gate,
                                   const float* __restrict up, const float* __restrict dout, int64_t f) {
  for (int64_t i = 0; i < f; ++i) {
    float vg, vu;
    num::swiglu_backward(gate[i], up[i], dout[i], vg, vu);
    dgate[i] = Round ? num::round_bf16(vg) : vg;
    dup[i] = Round ? num::round_bf16(vu) : vu;
  }
}
}  // namespace

void swiglu_forward(const OpContext& ctx, const Tensor& out, const Tensor& fc1, const Tensor& out_amax) {
  const int64_t T = out.dim(0), f = out.dim(1);
  const float* in = fc1.f32();
  float* o = out.f32();
  const bool round = ctx.round_bf16, amax = out_amax.data != nullptr;
  float m = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m)
  for (int64_t t = 0; t < T; ++t) {
    const float* gate = in + t * 2 * f;
    if (round) {
      forward_row<true>(o + t * f, gate, gate + f, f);
    } else {
      forward_row<false>(o + t * f, gate, gate + f, f);
    }
    if (amax) m = std::max(m, contiguous_amax(o + t * f, f));
  }
  store_out_amax(out_amax, m);
}

void swiglu_backward(const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1,
                     const Tensor& dfc1_amax) {
  const int64_t T = dout.dim(0), f = dout.dim(1);
  const float* in = fc1.f32();
  const float* go = dout.f32();
  float* d = dfc1.f32();
  const bool round = ctx.round_bf16, amax = dfc1_amax.data != nullptr;
  float m = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m)
  for (int64_t t = 0; t < T; ++t) {
    const float* gate = in + t * 2 * f;
    float* dgate = d + t * 2 * f;
    if (round) {
      backward_row<true>(dgate, dgate + f, gate, gate + f, go + t * f, f);
    } else {
      backward_row<false>(dgate, dgate + f, gate, gate + f, go + t * f, f);
    }
    if (amax) m = std::max(m, contiguous_amax(dgate, 2 * f));
  }
  store_out_amax(dfc1_amax, m);
}

}  // namespace pl::cpu
