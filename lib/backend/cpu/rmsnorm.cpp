// CPU RMSNorm (Llama): out = (x * rstd) * w, rstd = 1/sqrt(mean(x²) + eps).
// Precision: everything is fp32. The per-row sums (Σx² in the forward, Σ (dout·w)·x in the backward)
// are num::lane_sum with kRmsNormLanes lanes; the per-column weight-gradient sums over tokens are
// sequential fp32 sums over chunks of kRmsNormDwChunk tokens, the chunk partials combined by
// num::tree_sum (numerics/reduce.h). The CUDA backend runs the same schedule, so rstd, out, dx and dw
// are bit-identical across the backends. Forward and the dx part of the backward run OpenMP over rows;
// dw runs OpenMP over (chunk, column block) and then over columns: deterministic and independent of
// the thread count.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "numerics/bf16.h"
#include "numerics/reduce.h"

namespace pl::cpu {

void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& w, float eps) {
  const int64_t T = x.dim(0), h = x.dim(1);
  const float* xp = x.f32();
  const float* wp = w.f32();
  float* op_ = out.f32();
  float* rp = rstd.f32();
  const bool round = ctx.round_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = xp + t * h;
    const float ss = num::lane_sum<num::kRmsNormLanes>(h, [xr](int64_t i) { return xr[i] * xr[i]; });
    const float ms = ss / static_cast<float>(h);
    const float r = 1.0f / std::sqrt(ms + eps);
    rp[t] = r;
    float* o = op_ + t * h;
    for (int64_t i = 0; i < h; ++i) {
      const float v = (xr[i] * r) * wp[i];
      o[i] = round ? num::round_bf16(v) : v;
    }
  }
}

void rmsnorm_backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                      const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const int64_t T = x.dim(0), h = x.dim(1);
  const float* xp = x.f32();
  const float* wp = w.f32();
  const float* gp = dout.f32();
  const float* rp = rstd.f32();
  float* dxp = dx.f32();
  float* dwp = dw.f32();
  const bool round = ctx.round_bf16;

  // dx_i += r w_i g_i - (r³/h) x_i Σ_j g_j w_j x_j   (then rounded: dx is a bf16 activation gradient)
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = xp + t * h;
    const float* gr = gp + t * h;
    const float dot = num::lane_sum<num::kRmsNormLanes>(h, [xr, gr, wp](int64_t i) { return (gr[i] * wp[i]) * xr[i]; });
    const float r = rp[t];
    const float coef = dot * (r * r * r) / static_cast<float>(h);
    float* d = dxp + t * h;
    for (int64_t i = 0; i < h; ++i) {
      const float v = d[i] + (r * (wp[i] * gr[i]) - coef * xr[i]);
      d[i] = round ? num::round_bf16(v) : v;
    }
  }

  // dw_i += Σ_t g_ti x_ti r_t   (fp32 accumulator, never rounded): partial[k][c] = the sequential fp32
  // sum over chunk k's tokens, then tree_sum over the chunks of each column. The partials live in the
  // calling thread's thread_scratch.
  const int64_t chunks = (T + num::kRmsNormDwChunk - 1) / num::kRmsNormDwChunk;
  if (chunks == 0) return;
  float* part = thread_scratch<2>(static_cast<size_t>(chunks * h));
  const int64_t blocks = (h + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t kb = 0; kb < chunks * blocks; ++kb) {
    const int64_t k = kb / blocks, b = kb % blocks;
    const int64_t c0 = b * kColumnBlock, c1 = std::min(h, c0 + kColumnBlock);
    const int64_t t0 = k * num::kRmsNormDwChunk, t1 = std::min(T, t0 + num::kRmsNormDwChunk);
    float acc[kColumnBlock];
    for (int64_t c = c0; c < c1; ++c) acc[c - c0] = 0.0f;
    for (int64_t t = t0; t < t1; ++t) {
      const float* xr = xp + t * h;
      const float* gr = gp + t * h;
      const float r = rp[t];
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] = acc[c - c0] + gr[c] * (xr[c] * r);
    }
    for (int64_t c = c0; c < c1; ++c) part[k * h + c] = acc[c - c0];
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < h; ++c) dwp[c] += num::tree_sum(part + c, chunks, h);
}

}  // namespace pl::cpu
