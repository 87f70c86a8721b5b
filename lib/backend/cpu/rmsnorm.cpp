// CPU RMSNorm (Llama): out = (x * rstd) * w, rstd = 1/sqrt(mean(x²) + eps); add_rmsnorm_forward, the
// residual add fused in (the sum written and normed row by row); rmsnorm_backward_overwrite, dx
// overwritten instead of accumulated into. The forwards' out_amax: each row's max |out| after the row is
// written (in cache), the rows' maxima combined by max (order-independent, NaN ignored).
// Precision: everything is fp32. The per-row sums (Σx² in the forward, Σ (dout·w)·x in the backward)
// are num::lane_sum with kRmsNormLanes lanes; the per-column weight-gradient sums over tokens are
// sequential fp32 sums over chunks of kRmsNormDwChunk tokens, the chunk partials combined by
// num::tree_sum (numerics/reduce.h). The CUDA backend runs the same schedule, so rstd, out, dx and dw
// are bit-identical across the backends. Forward and the dx part of the backward run OpenMP over rows (one
// vectorized function per row, the lane sums written out in their order);
// dw runs OpenMP over (chunk, column block) and then over columns: deterministic and independent of
// the thread count.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quantize_tile.h"  // contiguous_amax: the quantizer's own amax rule
#include "backend/cpu/vector_clones.h"
#include "numerics/bf16.h"
#include "numerics/reduce.h"

namespace pl::cpu {

namespace {
constexpr int kLanes = num::kRmsNormLanes;

// Σ a[i] * b[i] (a == b: Σ a[i]², both only read) with the additions of num::lane_sum<kLanes> (term i into lane
// i % kLanes in increasing i, then num::tree_sum), written out so that it vectorizes.
PL_VECTOR_CLONES float lane_dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] = lane[k] + a[i + k] * b[i + k];
  for (int k = 0; i < n; ++i, ++k) lane[k] = lane[k] + a[i] * b[i];
  return num::tree_sum(lane, kLanes);
}

// Σ (g[i] * w[i]) * x[i] in the same order (the backward's dot).
PL_VECTOR_CLONES float lane_dot3(const float* __restrict g, const float* __restrict w, const float* __restrict x,
                                 int64_t n) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] = lane[k] + (g[i + k] * w[i + k]) * x[i + k];
  for (int k = 0; i < n; ++i, ++k) lane[k] = lane[k] + (g[i] * w[i]) * x[i];
  return num::tree_sum(lane, kLanes);
}

template <bool Round>
PL_VECTOR_CLONES void forward_row(float* __restrict o, const float* __restrict x, const float* __restrict w,
                                  float r, int64_t h) {
  for (int64_t i = 0; i < h; ++i) {
    const float v = (x[i] * r) * w[i];
    o[i] = Round ? num::round_bf16(v) : v;
  }
}

// Accumulate false: dx overwritten with bf16(0 + increment), the same bits as a zeroed dx accumulated
// into (0 + v is v except that -0 becomes +0, as it does after fill_zero).
template <bool Round, bool Accumulate>
PL_VECTOR_CLONES void backward_row(float* __restrict d, const float* __restrict g, const float* __restrict x,
                                   const float* __restrict w, float r, float coef, int64_t h) {
  for (int64_t i = 0; i < h; ++i) {
    const float v = (Accumulate ? d[i] : 0.0f) + (r * (w[i] * g[i]) - coef * x[i]);
    d[i] = Round ? num::round_bf16(v) : v;
  }
}

// s = a + b (rounded when Round: exactly add), kept for the row's norm.
template <bool Round>
PL_VECTOR_CLONES void add_row(float* __restrict s, const float* a, const float* b, int64_t h) {
  for (int64_t i = 0; i < h; ++i) s[i] = Round ? num::round_bf16(a[i] + b[i]) : a[i] + b[i];
}

// rstd of row x and out = (x * rstd) * w: rmsnorm_forward of one row.
void norm_row(float* o, float* rstd, const float* x, const float* w, int64_t h, float eps, bool round) {
  const float ss = lane_dot(x, x, h);
  const float ms = ss / static_cast<float>(h);
  const float r = 1.0f / std::sqrt(ms + eps);
  *rstd = r;
  if (round) {
    forward_row<true>(o, x, w, r, h);
  } else {
    forward_row<false>(o, x, w, r, h);
  }
}

// partial[c] (c in [c0, c1)) = the sequential fp32 sum over tokens t0..t1-1 of g[t][c] * (x[t][c] * r[t]).
PL_VECTOR_CLONES void dw_chunk(float* __restrict partial, const float* __restrict xp, const float* __restrict gp,
                               const float* __restrict rp, int64_t h, int64_t t0, int64_t t1, int64_t c0,
                               int64_t c1) {
  float acc[kColumnBlock];
  for (int64_t c = c0; c < c1; ++c) acc[c - c0] = 0.0f;
  for (int64_t t = t0; t < t1; ++t) {
    const float* xr = xp + t * h;
    const float* gr = gp + t * h;
    const float r = rp[t];
    for (int64_t c = c0; c < c1; ++c) acc[c - c0] = acc[c - c0] + gr[c] * (xr[c] * r);
  }
  for (int64_t c = c0; c < c1; ++c) partial[c] = acc[c - c0];
}
}  // namespace

void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& w, float eps, const Tensor& out_amax) {
  const int64_t T = x.dim(0), h = x.dim(1);
  const float* xp = x.f32();
  const float* wp = w.f32();
  float* op_ = out.f32();
  float* rp = rstd.f32();
  const bool round = ctx.round_bf16, amax = out_amax.data != nullptr;
  float m = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m)
  for (int64_t t = 0; t < T; ++t) {
    norm_row(op_ + t * h, rp + t, xp + t * h, wp, h, eps, round);
    if (amax) m = std::max(m, contiguous_amax(op_ + t * h, h));
  }
  store_out_amax(out_amax, m);
}

// Row by row: the sum is written and normed while the row is in cache (one pass instead of add's and
// then the norm's).
void add_rmsnorm_forward(const OpContext& ctx, const Tensor& resid_out, const Tensor& norm_out, const Tensor& rstd,
                         const Tensor& a, const Tensor& b, const Tensor& w, float eps, const Tensor& norm_out_amax) {
  const int64_t T = a.dim(0), h = a.dim(1);
  const float* ap = a.f32();
  const float* bp = b.f32();
  const float* wp = w.f32();
  float* sp = resid_out.f32();
  float* op_ = norm_out.f32();
  float* rp = rstd.f32();
  const bool round = ctx.round_bf16, amax = norm_out_amax.data != nullptr;
  float m = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m)
  for (int64_t t = 0; t < T; ++t) {
    float* s = sp + t * h;
    if (round) {
      add_row<true>(s, ap + t * h, bp + t * h, h);
    } else {
      add_row<false>(s, ap + t * h, bp + t * h, h);
    }
    norm_row(op_ + t * h, rp + t, s, wp, h, eps, round);
    if (amax) m = std::max(m, contiguous_amax(op_ + t * h, h));
  }
  store_out_amax(norm_out_amax, m);
}

namespace {
template <bool Accumulate>
void backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
              const Tensor& w, const Tensor& rstd) {
  const int64_t T = x.dim(0), h = x.dim(1);
  const float* xp = x.f32();
  const float* wp = w.f32();
  const float* gp = dout.f32();
  const float* rp = rstd.f32();
  float* dxp = dx.f32();
  float* dwp = dw.f32();
  const bool round = ctx.round_bf16;

  // dw_i += Σ_t g_ti x_ti r_t   (fp32 accumulator, never rounded): partial[k][c] = the sequential fp32
  // sum over chunk k's tokens, then tree_sum over the chunks of each column. The partials live in the
  // calling thread's thread_scratch.
  const int64_t chunks = (T + num::kRmsNormDwChunk - 1) / num::kRmsNormDwChunk;
  if (chunks == 0) return;
  float* part = thread_scratch<2>(static_cast<size_t>(chunks * h));
  const int64_t blocks = (h + kColumnBlock - 1) / kColumnBlock;
  // One parallel region, not three: starting one wakes the worker threads, which at llama_small's sizes
  // costs as much as the work (measured under OMP_WAIT_POLICY=PASSIVE). The dx rows and the dw partials
  // are independent (nowait); the column sums wait for the partials.
#pragma omp parallel
  {
    // dx_i += r w_i g_i - (r³/h) x_i Σ_j g_j w_j x_j   (then rounded: dx is a bf16 activation gradient)
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = xp + t * h;
      const float* gr = gp + t * h;
      const float dot = lane_dot3(gr, wp, xr, h);
      const float r = rp[t];
      const float coef = dot * (r * r * r) / static_cast<float>(h);
      if (round) {
        backward_row<true, Accumulate>(dxp + t * h, gr, xr, wp, r, coef, h);
      } else {
        backward_row<false, Accumulate>(dxp + t * h, gr, xr, wp, r, coef, h);
      }
    }
#pragma omp for schedule(static)
    for (int64_t kb = 0; kb < chunks * blocks; ++kb) {
      const int64_t k = kb / blocks, b = kb % blocks;
      const int64_t c0 = b * kColumnBlock, c1 = std::min(h, c0 + kColumnBlock);
      const int64_t t0 = k * num::kRmsNormDwChunk, t1 = std::min(T, t0 + num::kRmsNormDwChunk);
      dw_chunk(part + k * h, xp, gp, rp, h, t0, t1, c0, c1);
    }
#pragma omp for schedule(static)
    for (int64_t c = 0; c < h; ++c) dwp[c] += num::tree_sum(part + c, chunks, h);
  }
}
}  // namespace

void rmsnorm_backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                      const Tensor& x, const Tensor& w, const Tensor& rstd) {
  backward<true>(ctx, dx, dw, dout, x, w, rstd);
}

void rmsnorm_backward_overwrite(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                const Tensor& x, const Tensor& w, const Tensor& rstd) {
  backward<false>(ctx, dx, dw, dout, x, w, rstd);
}

}  // namespace pl::cpu
