// CPU RMSNorm (Llama): out = (x * rstd) * w, rstd = 1/sqrt(mean(x²) + eps).
// Precision: the per-row sums (Σx² in the forward, Σ dout·w·x in the backward) and the per-column
// weight-gradient sums over tokens are accumulated in double, then used in fp32; all elementwise math
// is fp32. Forward and the dx part of the backward run OpenMP over rows; dw runs OpenMP over column
// blocks with tokens in order, so it is deterministic and independent of the thread count.
#include <algorithm>
#include <cmath>

#include "backend/cpu/check.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "numerics/bf16.h"

namespace pl::cpu {

namespace {

constexpr int64_t kColumnBlock = 64;  // columns of dw one thread owns at a time

}  // namespace

void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& w, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  check_cpu(op, "out", out, DType::F32, 2);
  check_cpu(op, "rstd", rstd, DType::F32, 1);
  check_cpu(op, "x", x, DType::F32, 2);
  check_cpu(op, "w", w, DType::F32, 1);
  PL_CHECK(x.dim(1) == w.dim(0) && x.dim(1) > 0, "{}: x {} does not match w {}", op, x.shape_str(),
           w.shape_str());
  PL_CHECK(out.dim(0) == x.dim(0) && out.dim(1) == x.dim(1), "{}: out {} does not match x {}", op,
           out.shape_str(), x.shape_str());
  PL_CHECK(rstd.dim(0) == x.dim(0), "{}: rstd {} does not match x {} (expected [{}])", op, rstd.shape_str(),
           x.shape_str(), x.dim(0));
  PL_CHECK(eps >= 0.0f, "{}: eps = {} must be >= 0", op, eps);
  const int64_t T = x.dim(0), h = x.dim(1);
  const float* xp = x.f32();
  const float* wp = w.f32();
  float* op_ = out.f32();
  float* rp = rstd.f32();
  const bool round = ctx.round_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = xp + t * h;
    double ss = 0.0;
    for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float ms = static_cast<float>(ss / static_cast<double>(h));
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
  constexpr const char* op = "rmsnorm_backward";
  check_cpu(op, "dx", dx, DType::F32, 2);
  check_cpu(op, "dw", dw, DType::F32, 1);
  check_cpu(op, "dout", dout, DType::F32, 2);
  check_cpu(op, "x", x, DType::F32, 2);
  check_cpu(op, "w", w, DType::F32, 1);
  check_cpu(op, "rstd", rstd, DType::F32, 1);
  PL_CHECK(x.dim(1) == w.dim(0) && x.dim(1) > 0, "{}: x {} does not match w {}", op, x.shape_str(),
           w.shape_str());
  PL_CHECK(dw.dim(0) == w.dim(0), "{}: dw {} does not match w {}", op, dw.shape_str(), w.shape_str());
  PL_CHECK(dout.dim(0) == x.dim(0) && dout.dim(1) == x.dim(1), "{}: dout {} does not match x {}", op,
           dout.shape_str(), x.shape_str());
  PL_CHECK(dx.dim(0) == x.dim(0) && dx.dim(1) == x.dim(1), "{}: dx {} does not match x {}", op,
           dx.shape_str(), x.shape_str());
  PL_CHECK(rstd.dim(0) == x.dim(0), "{}: rstd {} does not match x {} (expected [{}])", op, rstd.shape_str(),
           x.shape_str(), x.dim(0));
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
    double dot = 0.0;
    for (int64_t i = 0; i < h; ++i) dot += static_cast<double>(gr[i] * wp[i]) * xr[i];
    const float r = rp[t];
    const float coef = static_cast<float>(dot) * (r * r * r) / static_cast<float>(h);
    float* d = dxp + t * h;
    for (int64_t i = 0; i < h; ++i) {
      const float v = d[i] + (r * (wp[i] * gr[i]) - coef * xr[i]);
      d[i] = round ? num::round_bf16(v) : v;
    }
  }

  // dw_i += Σ_t g_ti x_ti r_t   (fp32 accumulator, never rounded)
  const int64_t blocks = (h + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kColumnBlock, c1 = std::min(h, c0 + kColumnBlock);
    double acc[kColumnBlock] = {};
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = xp + t * h;
      const float* gr = gp + t * h;
      const float r = rp[t];
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(gr[c] * (xr[c] * r));
    }
    for (int64_t c = c0; c < c1; ++c) dwp[c] += static_cast<float>(acc[c - c0]);
  }
}

}  // namespace pl::cpu
