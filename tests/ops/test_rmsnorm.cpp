// RMSNorm forward/backward against double references and finite differences, and the fp32 summation
// schedule of numerics/reduce.h written out (the CUDA backend follows the same one, bit for bit).
// Cpu/RmsNorm.* and Cuda/RmsNorm.* run the same cases on each backend (the GPU also against the CPU
// backend, bit for bit); OpsRmsNorm.* are CPU-only (plain FP32, finite differences, the schedule).
#include "op_test_util.h"

namespace pl::optest {
namespace {

constexpr int64_t kRmsnormT = 9, kRmsnormH = 100;
constexpr float kEps = 1e-5f;

struct RefForward {
  std::vector<double> out, rstd;
};

RefForward rmsnorm_ref_forward(const std::vector<double>& x, const std::vector<double>& w, int64_t T, int64_t h,
                               double eps) {
  RefForward r{std::vector<double>(x.size()), std::vector<double>(static_cast<size_t>(T))};
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < h; ++i) ss += x[t * h + i] * x[t * h + i];
    const double rs = 1.0 / std::sqrt(ss / double(h) + eps);
    r.rstd[t] = rs;
    for (int64_t i = 0; i < h; ++i) r.out[t * h + i] = x[t * h + i] * rs * w[i];
  }
  return r;
}

// Analytic gradients of L = <out, g>: dx = r w g - (r³/h) x Σ g w x ; dw = Σ_t g x r.
void rmsnorm_ref_backward(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& g,
                          int64_t T, int64_t h, double eps, std::vector<double>& dx, std::vector<double>& dw) {
  const RefForward f = rmsnorm_ref_forward(x, w, T, h, eps);
  dx.assign(x.size(), 0.0);
  dw.assign(w.size(), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const double r = f.rstd[t];
    double dot = 0.0;
    for (int64_t i = 0; i < h; ++i) dot += g[t * h + i] * w[i] * x[t * h + i];
    for (int64_t i = 0; i < h; ++i) {
      dx[t * h + i] = r * w[i] * g[t * h + i] - r * r * r / double(h) * x[t * h + i] * dot;
      dw[i] += g[t * h + i] * x[t * h + i] * r;
    }
  }
}

TEST(OpsRmsNorm, ForwardMatchesDouble) {
  std::mt19937 rng(301);
  HostF32 x = random_f32({kRmsnormT, kRmsnormH}, rng, -2, 2), w = random_f32({kRmsnormH}, rng, 0.5, 1.5);
  HostF32 out({kRmsnormT, kRmsnormH}), rstd({kRmsnormT});
  rmsnorm_forward(cpu_ctx(false), out.t(), rstd.t(), x.t(), w.t(), kEps, {});
  const RefForward ref = rmsnorm_ref_forward(x.d(), w.d(), kRmsnormT, kRmsnormH, kEps);
  expect_close(out.v, ref.out, 1e-5, "out");
  expect_close(rstd.v, ref.rstd, 1e-6, "rstd");
}

TEST(OpsRmsNorm, BackwardAccumulatesAndMatchesDouble) {
  std::mt19937 rng(302);
  HostF32 x = random_f32({kRmsnormT, kRmsnormH}, rng, -2, 2), w = random_f32({kRmsnormH}, rng, 0.5, 1.5);
  HostF32 g = random_f32({kRmsnormT, kRmsnormH}, rng);
  HostF32 dx0 = random_f32({kRmsnormT, kRmsnormH}, rng), dw0 = random_f32({kRmsnormH}, rng);
  HostF32 out({kRmsnormT, kRmsnormH}), rstd({kRmsnormT});
  rmsnorm_forward(cpu_ctx(false), out.t(), rstd.t(), x.t(), w.t(), kEps, {});
  HostF32 dx = dx0, dw = dw0;
  rmsnorm_backward(cpu_ctx(false), dx.t(), dw.t(), g.t(), x.t(), w.t(), rstd.t());
  std::vector<double> rdx, rdw;
  rmsnorm_ref_backward(x.d(), w.d(), g.d(), kRmsnormT, kRmsnormH, kEps, rdx, rdw);
  // Compare the increments (the prefill is exact in both).
  std::vector<double> inc_dx(dx.size()), inc_dw(dw.size());
  for (size_t i = 0; i < dx.size(); ++i) inc_dx[i] = double(dx[i]) - dx0[i];
  for (size_t i = 0; i < dw.size(); ++i) inc_dw[i] = double(dw[i]) - dw0[i];
  expect_close(inc_dx, rdx, 1e-5, "dx increment");
  expect_close(inc_dw, rdw, 1e-5, "dw increment");
}

TEST(OpsRmsNorm, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(303);
  const int64_t T = 3, h = 17;
  HostF32 x = random_f32({T, h}, rng, -2, 2), w = random_f32({h}, rng, 0.5, 1.5), g = random_f32({T, h}, rng);
  const std::vector<double> xd = x.d(), wd = w.d(), gd = g.d();
  const auto loss_x = [&](const std::vector<double>& xv) {
    return dot(rmsnorm_ref_forward(xv, wd, T, h, kEps).out, gd);
  };
  const auto loss_w = [&](const std::vector<double>& wv) {
    return dot(rmsnorm_ref_forward(xd, wv, T, h, kEps).out, gd);
  };
  const std::vector<double> fd_dx = finite_diff(loss_x, xd), fd_dw = finite_diff(loss_w, wd);
  std::vector<double> rdx, rdw;
  rmsnorm_ref_backward(xd, wd, gd, T, h, kEps, rdx, rdw);
  expect_close(rdx, fd_dx, 1e-7, "reference dx vs finite differences");
  expect_close(rdw, fd_dw, 1e-7, "reference dw vs finite differences");
  // And the op itself.
  HostF32 out({T, h}), rstd({T}), dx({T, h}), dw({h});
  rmsnorm_forward(cpu_ctx(false), out.t(), rstd.t(), x.t(), w.t(), kEps, {});
  rmsnorm_backward(cpu_ctx(false), dx.t(), dw.t(), g.t(), x.t(), w.t(), rstd.t());
  expect_close(dx.v, fd_dx, 1e-5, "op dx vs finite differences");
  expect_close(dw.v, fd_dw, 1e-5, "op dw vs finite differences");
}

TEST(OpsRmsNorm, BackwardIndependentOfThreadCount) {
  std::mt19937 rng(305);
  const int64_t T = 33, h = 200;  // several 64-column blocks of dw, with a tail
  HostF32 x = random_f32({T, h}, rng, -2, 2), w = random_f32({h}, rng, 0.5, 1.5), g = random_f32({T, h}, rng);
  HostF32 out({T, h}), rstd({T});
  rmsnorm_forward(cpu_ctx(false), out.t(), rstd.t(), x.t(), w.t(), kEps, {});
  HostF32 dx[2] = {HostF32({T, h}), HostF32({T, h})}, dw[2] = {HostF32({h}), HostF32({h})};
  for (int r = 0; r < 2; ++r) {
    ScopedThreads threads(r + 1);
    rmsnorm_backward(cpu_ctx(true), dx[r].t(), dw[r].t(), g.t(), x.t(), w.t(), rstd.t());
  }
  EXPECT_TRUE(bitwise_equal(dx[0].v, dx[1].v));
  EXPECT_TRUE(bitwise_equal(dw[0].v, dw[1].v));
}

// The documented schedule, written out with plain loops: row sums in 256 lanes (element i -> lane
// i % 256, in order, from +0) combined by the stride tree (s = 128..1: lane[k] += lane[k + s]); dw:
// sequential fp32 sums over chunks of 128 tokens, the chunk partials by the stride tree over the
// chunk count (s from the largest power of two below it: a[k] += a[k + s] where k + s < n).
float lanes256(const std::vector<float>& terms) {
  float lane[256] = {};
  for (size_t i = 0; i < terms.size(); ++i) lane[i % 256] = lane[i % 256] + terms[i];
  for (int s = 128; s >= 1; s /= 2)
    for (int k = 0; k < s; ++k) lane[k] = lane[k] + lane[k + s];
  return lane[0];
}

TEST(OpsRmsNorm, FollowsTheDocumentedFp32Schedule) {
  std::mt19937 rng(306);
  const int64_t T = 301, h = 1000;  // 3 dw chunks (the last partial), rows longer than the 256 lanes
  HostF32 x = random_f32({T, h}, rng, -2, 2, true), w = random_f32({h}, rng, 0.5, 1.5, true);
  HostF32 g = random_f32({T, h}, rng, -1, 1, true);
  for (int64_t i = 0; i < T * h; i += 7) x[static_cast<size_t>(i)] *= 1000.0f;  // make the order matter
  HostF32 out({T, h}), rstd({T}), dx({T, h}), dw({h});
  rmsnorm_forward(cpu_ctx(true), out.t(), rstd.t(), x.t(), w.t(), kEps, {});
  rmsnorm_backward(cpu_ctx(true), dx.t(), dw.t(), g.t(), x.t(), w.t(), rstd.t());
  std::vector<float> terms(static_cast<size_t>(h));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < h; ++i) terms[i] = x[t * h + i] * x[t * h + i];
    const float r = 1.0f / std::sqrt(lanes256(terms) / static_cast<float>(h) + kEps);
    ASSERT_EQ(num::float_bits(rstd[t]), num::float_bits(r)) << "rstd row " << t;
    for (int64_t i = 0; i < h; ++i) terms[i] = (g[t * h + i] * w[i]) * x[t * h + i];
    const float coef = lanes256(terms) * (r * r * r) / static_cast<float>(h);
    for (int64_t i = 0; i < h; ++i) {
      const float v = num::round_bf16(0.0f + (r * (w[i] * g[t * h + i]) - coef * x[t * h + i]));
      ASSERT_EQ(num::float_bits(dx[t * h + i]), num::float_bits(v)) << "dx " << t << "," << i;
    }
  }
  for (int64_t c = 0; c < h; ++c) {
    float part[3] = {};
    for (int64_t t = 0; t < T; ++t) part[t / 128] = part[t / 128] + g[t * h + c] * (x[t * h + c] * rstd[t]);
    const float total = (part[0] + part[2]) + part[1];  // n = 3: s = 2 (a0 += a2), s = 1 (a0 += a1)
    ASSERT_EQ(num::float_bits(dw[c]), num::float_bits(0.0f + total)) << "dw " << c;
  }
}

// The producers' amax (issue 40): out_amax equals what quantize's own amax pass computes from out (NaN
// ignored: one NaN row here), in both slots of a [2], with and without BF16 rounding; and add_rmsnorm_forward's.
TEST(OpsRmsNorm, OutputAmaxEqualsTheQuantizersPass) {
  std::mt19937 rng(307);
  for (const bool round : {true, false}) {
    SCOPED_TRACE(round ? "round_bf16" : "fp32");
    HostF32 x = random_f32({kRmsnormT, kRmsnormH}, rng, -2, 2), w = random_f32({kRmsnormH}, rng, -1.5, 1.5), y = random_f32({kRmsnormT, kRmsnormH}, rng);
    x[3 * kRmsnormH + 1] = NAN;
    HostF32 out({kRmsnormT, kRmsnormH}), rstd({kRmsnormT}), resid({kRmsnormT, kRmsnormH}), a1({1}, -1.0f), a2({2}, -1.0f);
    rmsnorm_forward(cpu_ctx(round), out.t(), rstd.t(), x.t(), w.t(), kEps, a2.t());
    EXPECT_TRUE(std::isnan(out[3 * kRmsnormH]));
    EXPECT_GT(a2[0], 0.0f);
    EXPECT_EQ(a2[0], quantizer_amax(out));
    EXPECT_EQ(a2[1], a2[0]);
    add_rmsnorm_forward(cpu_ctx(round), resid.t(), out.t(), rstd.t(), x.t(), y.t(), w.t(), kEps, a1.t());
    EXPECT_GT(a1[0], 0.0f);
    EXPECT_EQ(a1[0], quantizer_amax(out));
  }
}

TEST(OpsRmsNorm, ErrorsNameTheOp) {
  HostF32 x({4, 8}), w({8}), w_bad({7}), out({4, 8}), rstd({4}), rstd_bad({5});
  const OpContext ctx = cpu_ctx(false);
  expect_error_naming("rmsnorm_forward",
                      [&] { rmsnorm_forward(ctx, out.t(), rstd.t(), x.t(), w_bad.t(), kEps, {}); });
  expect_error_naming("rmsnorm_forward",
                      [&] { rmsnorm_forward(ctx, out.t(), rstd_bad.t(), x.t(), w.t(), kEps, {}); });
  HostF32 amax3({3}), amax_f({1, 1});
  expect_error_naming("out_amax", [&] { rmsnorm_forward(ctx, out.t(), rstd.t(), x.t(), w.t(), kEps, amax3.t()); });
  expect_error_naming("out_amax", [&] { rmsnorm_forward(ctx, out.t(), rstd.t(), x.t(), w.t(), kEps, amax_f.t()); });
  expect_error_naming("rmsnorm_backward",
                      [&] { rmsnorm_backward(ctx, out.t(), w_bad.t(), out.t(), x.t(), w.t(), rstd.t()); });
}

// ---- on every backend (Cpu/ and Cuda/RmsNorm.*) ---------------------------------------------------

class RmsNorm : public OnBackend {};
PL_INSTANTIATE_BACKENDS(RmsNorm);

// Forward and backward with round_bf16 on BF16 inputs: out and dx are BF16 values within BF16
// rounding of double, rstd and dw are fp32 and never rounded. Exact between backends: Σx² and
// Σ (g w) x in the CPU's fp32 lane/tree schedule (numerics/reduce.h), the same correctly rounded
// division, sqrt and reciprocal and the same elementwise expressions; dw: the same sequential fp32
// sums over token chunks of 128 and the same tree over the chunks (T = 301: 3 chunks, a 3-leaf tree,
// the last one partial; h = 333 not a multiple of a block).
TEST_P(RmsNorm, RoundBf16) {
  PL_SEEDED_RNG(rng);
  for (const auto& [T, h] : {std::pair<int64_t, int64_t>{kRmsnormT, kRmsnormH}, {301, 333}}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " h=" + std::to_string(h));
    std::vector<float> x = uniform_bf16(T * h, rng, -2.0f, 2.0f), w = uniform_bf16(h, rng, 0.5f, 1.5f);
    std::vector<float> g = uniform_bf16(T * h, rng, -1.0f, 1.0f);
    const std::vector<float> dx0 = uniform_bf16(T * h, rng, -1.0f, 1.0f), dw0 = uniform_f32(h, rng, -1.0f, 1.0f);
    const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), gd(g.begin(), g.end());
    const std::vector<float> fwd = run_exact(GetParam(), [&](Backend& k) {  // [out | rstd]
      std::vector<float> out(T * h), rstd(T);
      rmsnorm_forward(k.ctx(), k.put(out, {T, h}, DType::BF16), k.put(rstd, {T}, DType::F32),
                      k.put(x, {T, h}, DType::BF16), k.put(w, {h}, DType::BF16), kEps, {});
      return joined({k.get(out), k.get(rstd)});
    }, "rmsnorm_forward [out | rstd]");
    const std::vector<float> out(fwd.begin(), fwd.begin() + T * h);
    std::vector<float> rstd(fwd.begin() + T * h, fwd.end());
    expect_bf16_representable(out, "out");
    expect_bf16_close(out, rmsnorm_ref_forward(xd, wd, T, h, kEps).out, "out");

    const auto backward = [&](Backend& k, bool round) {  // [dx | dw]
      std::vector<float> dx = dx0, dw = dw0;
      rmsnorm_backward(k.ctx(round), k.put(dx, {T, h}, DType::BF16), k.put(dw, {h}, DType::F32),
                       k.put(g, {T, h}, DType::BF16), k.put(x, {T, h}, DType::BF16), k.put(w, {h}, DType::BF16),
                       k.put(rstd, {T}, DType::F32));
      return joined({k.get(dx), k.get(dw)});
    };
    const std::vector<float> bwd =
        run_exact(GetParam(), [&](Backend& k) { return backward(k, true); }, "rmsnorm_backward [dx | dw]");
    const std::vector<float> dx(bwd.begin(), bwd.begin() + T * h);
    expect_bf16_representable(dx, "dx");
    std::vector<double> rdx, rdw;
    rmsnorm_ref_backward(xd, wd, gd, T, h, kEps, rdx, rdw);
    for (size_t i = 0; i < rdx.size(); ++i) rdx[i] += dx0[i];
    // dx = round(prefill + increment); the increment is fp32, so bf16 tolerance relative to the sum.
    expect_bf16_close(dx, rdx, "dx", 1.0 / 128, 1e-3);
    if (on_cuda()) continue;
    // Against the plain-FP32 CPU run: only out and dx are rounded.
    Backend cpu(Device::CPU);
    std::vector<float> out_plain(T * h), rstd_plain(T);
    rmsnorm_forward(cpu.ctx(false), cpu.put(out_plain, {T, h}, DType::F32), cpu.put(rstd_plain, {T}, DType::F32),
                    cpu.put(x, {T, h}, DType::F32), cpu.put(w, {h}, DType::F32), kEps, {});
    EXPECT_TRUE(bitwise_equal(rstd, rstd_plain)) << "rstd is fp32 and must not be rounded";
    const std::vector<float> plain = backward(cpu, false);
    EXPECT_TRUE(bitwise_equal(std::vector<float>(bwd.begin() + T * h, bwd.end()),
                              std::vector<float>(plain.begin() + T * h, plain.end())))
        << "dw is an fp32 accumulator and must not be rounded";
    for (int64_t i = 0; i < T * h; ++i) ASSERT_EQ(dx[i], num::round_bf16(plain[i])) << i;
  }
}

// add_rmsnorm_forward equals add then rmsnorm_forward, and rmsnorm_backward_overwrite equals fill_zero
// then rmsnorm_backward, bit for bit, on each backend (and the GPU's equal the CPU's). Odd shapes, h a
// multiple of 8 (the GPU's 16-byte path) and not; resid_out aliasing a (allowed, as for add); a row of
// zero gradients with negative weights, whose increments are -0 (overwritten: +0, as 0 + -0).
TEST_P(RmsNorm, FusedEqualsUnfused) {
  PL_SEEDED_RNG(rng);
  for (const auto& [T, h] : {std::pair<int64_t, int64_t>{7, 13}, {131, 264}, {5, 333}}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " h=" + std::to_string(h));
    const std::vector<float> a = uniform_bf16(T * h, rng, -2.0f, 2.0f), b = uniform_bf16(T * h, rng, -2.0f, 2.0f);
    const std::vector<float> w = uniform_bf16(h, rng, -1.5f, 1.5f), dw0 = uniform_f32(h, rng, -1.0f, 1.0f);
    std::vector<float> g = uniform_bf16(T * h, rng, -1.0f, 1.0f);
    std::fill(g.begin(), g.begin() + h, 0.0f);
    const std::vector<float> garbage = uniform_bf16(T * h, rng, -9.0f, 9.0f);
    for (const bool round : {true, false}) {
      if (!round && on_cuda()) continue;  // the GPU always rounds
      const auto forward = [&](Backend& k, bool fused, bool alias) {  // [resid | norm | rstd | norm's amax]
        std::vector<float> av = a, bv = b, wv = w, resid(T * h), norm(T * h), rstd(T), amax(1, -1.0f);
        const DType act = k.cuda() ? DType::BF16 : DType::F32;
        const Tensor at = k.put(av, {T, h}, act), bt = k.put(bv, {T, h}, act), wt = k.put(wv, {h}, act);
        const Tensor rt = alias ? at : k.put(resid, {T, h}, act);
        const Tensor nt = k.put(norm, {T, h}, act), st = k.put(rstd, {T}, DType::F32);
        const Tensor mt = k.put(amax, {1}, DType::F32);
        if (fused) {
          add_rmsnorm_forward(k.ctx(round), rt, nt, st, at, bt, wt, kEps, mt);
        } else {
          add(k.ctx(round), rt, at, bt);
          rmsnorm_forward(k.ctx(round), nt, st, rt, wt, kEps, mt);
        }
        return joined({k.get(alias ? av : resid), k.get(norm), k.get(rstd), k.get(amax)});
      };
      const auto backward = [&](Backend& k, bool fused, const std::vector<float>& x, const std::vector<float>& r) {
        std::vector<float> xv = x, rv = r, gv = g, wv = w, dw = dw0;
        std::vector<float> dx = fused ? garbage : std::vector<float>(T * h);
        const DType act = k.cuda() ? DType::BF16 : DType::F32;
        const Tensor dxt = k.put(dx, {T, h}, act), dwt = k.put(dw, {h}, DType::F32), gt = k.put(gv, {T, h}, act);
        const Tensor xt = k.put(xv, {T, h}, act), wt = k.put(wv, {h}, act), rt = k.put(rv, {T}, DType::F32);
        if (fused) {
          rmsnorm_backward_overwrite(k.ctx(round), dxt, dwt, gt, xt, wt, rt);
        } else {
          fill_zero(k.ctx(round), dxt);
          rmsnorm_backward(k.ctx(round), dxt, dwt, gt, xt, wt, rt);
        }
        return joined({k.get(dx), k.get(dw)});
      };
      const std::vector<float> fwd = run_exact(GetParam(), [&](Backend& k) { return forward(k, true, false); },
                                               "add_rmsnorm_forward");
      Backend k(GetParam());
      EXPECT_TRUE(bitwise_equal(fwd, forward(k, false, false))) << "fused forward != add + rmsnorm_forward";
      EXPECT_TRUE(bitwise_equal(fwd, forward(k, true, true))) << "fused forward with resid_out = a";
      const std::vector<float> x(fwd.begin(), fwd.begin() + T * h), r(fwd.begin() + 2 * T * h, fwd.end());
      const std::vector<float> bwd = run_exact(GetParam(), [&](Backend& kb) { return backward(kb, true, x, r); },
                                               "rmsnorm_backward_overwrite");
      EXPECT_TRUE(bitwise_equal(bwd, backward(k, false, x, r))) << "overwrite != fill_zero + rmsnorm_backward";
      for (int64_t i = 0; i < h; ++i) ASSERT_EQ(num::float_bits(bwd[i]), 0u) << "dx of a zero-gradient row: +0";
    }
  }
}

}  // namespace
}  // namespace pl::optest
