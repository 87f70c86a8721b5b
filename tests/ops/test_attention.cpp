// Causal GQA attention against a double reference (full softmax), its analytic gradient, and central
// finite differences of the double forward. On the CPU (Ops*) — both its paths: BF16 GEMMs by tile with P and
// dS rounded to BF16 (round_bf16 on a oneDNN BF16 engine), and FP32 (round_bf16 off, or the FP32 BLAS engine)
// — and, against the CPU backend, on the GPU (Cuda*, skipped without a device).
#include "backend/cpu/onednn_gemm.h"
#include "op_test_util.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/attention_graph.h"
#endif

namespace pl::optest {
namespace {

struct AttentionCase {
  int64_t B, S, nq, nkv, d;
};

AttentionShape shape_of(const AttentionCase& c) { return AttentionShape{c.B, c.S, c.nq, c.nkv, c.d}; }
int64_t width(const AttentionCase& c) { return (c.nq + 2 * c.nkv) * c.d; }

struct Idx {
  AttentionCase c;
  int64_t q(int64_t b, int64_t i, int64_t h) const { return (b * c.S + i) * width(c) + h * c.d; }
  int64_t k(int64_t b, int64_t j, int64_t g) const { return (b * c.S + j) * width(c) + (c.nq + g) * c.d; }
  int64_t v(int64_t b, int64_t j, int64_t g) const {
    return (b * c.S + j) * width(c) + (c.nq + c.nkv + g) * c.d;
  }
  int64_t o(int64_t b, int64_t i, int64_t h) const { return (b * c.S + i) * c.nq * c.d + h * c.d; }
};

// Probabilities P[i][j] (j <= i) of head h in batch b, and log-sum-exp per row, in double.
void ref_probs(const std::vector<double>& x, const AttentionCase& c, int64_t b, int64_t h, std::vector<double>& P,
               std::vector<double>& lse) {
  const Idx I{c};
  const int64_t g = h / (c.nq / c.nkv);
  const double scale = 1.0 / std::sqrt(double(c.d));
  P.assign(static_cast<size_t>(c.S * c.S), 0.0);
  lse.assign(static_cast<size_t>(c.S), 0.0);
  for (int64_t i = 0; i < c.S; ++i) {
    double m = -1e300;
    for (int64_t j = 0; j <= i; ++j) {
      double s = 0.0;
      for (int64_t e = 0; e < c.d; ++e) s += x[I.q(b, i, h) + e] * x[I.k(b, j, g) + e];
      P[i * c.S + j] = s * scale;
      m = std::max(m, s * scale);
    }
    double sum = 0.0;
    for (int64_t j = 0; j <= i; ++j) sum += std::exp(P[i * c.S + j] - m);
    for (int64_t j = 0; j <= i; ++j) P[i * c.S + j] = std::exp(P[i * c.S + j] - m) / sum;
    lse[i] = m + std::log(sum);
  }
}

void ref_forward(const std::vector<double>& x, const AttentionCase& c, std::vector<double>& out,
                 std::vector<double>& lse) {
  const Idx I{c};
  out.assign(static_cast<size_t>(c.B * c.S * c.nq * c.d), 0.0);
  lse.assign(static_cast<size_t>(c.B * c.nq * c.S), 0.0);
  std::vector<double> P, l;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.nq; ++h) {
      ref_probs(x, c, b, h, P, l);
      const int64_t g = h / (c.nq / c.nkv);
      for (int64_t i = 0; i < c.S; ++i) {
        lse[(b * c.nq + h) * c.S + i] = l[i];
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < c.d; ++e) out[I.o(b, i, h) + e] += P[i * c.S + j] * x[I.v(b, j, g) + e];
      }
    }
}

// Analytic gradient of L = <out, dout> w.r.t. qkv: dV = Pᵀ dO, dP = dO Vᵀ,
// dS = P ∘ (dP - rowsum(P ∘ dP)), dQ = scale dS K, dK = scale dSᵀ Q.
std::vector<double> ref_backward(const std::vector<double>& x, const std::vector<double>& dout,
                                 const AttentionCase& c) {
  const Idx I{c};
  const double scale = 1.0 / std::sqrt(double(c.d));
  std::vector<double> dx(x.size(), 0.0), P, l, dP(static_cast<size_t>(c.S * c.S));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.nq; ++h) {
      ref_probs(x, c, b, h, P, l);
      const int64_t g = h / (c.nq / c.nkv);
      for (int64_t i = 0; i < c.S; ++i) {
        double rowsum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0.0;
          for (int64_t e = 0; e < c.d; ++e) s += dout[I.o(b, i, h) + e] * x[I.v(b, j, g) + e];
          dP[i * c.S + j] = s;
          rowsum += P[i * c.S + j] * s;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double p = P[i * c.S + j], ds = p * (dP[i * c.S + j] - rowsum);
          for (int64_t e = 0; e < c.d; ++e) {
            dx[I.v(b, j, g) + e] += p * dout[I.o(b, i, h) + e];
            dx[I.q(b, i, h) + e] += scale * ds * x[I.k(b, j, g) + e];
            dx[I.k(b, j, g) + e] += scale * ds * x[I.q(b, i, h) + e];
          }
        }
      }
    }
  return dx;
}

class OpsAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(OpsAttention, ForwardMatchesDouble) {
  const AttentionCase c = GetParam();
  std::mt19937 rng(501);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2);
  HostF32 out({c.B * c.S, c.nq * c.d}, NAN), lse({c.B, c.nq, c.S}, NAN);
  attention_forward(cpu_ctx(false), out.t(), lse.t(), qkv.t(), shape_of(c));
  std::vector<double> rout, rlse;
  ref_forward(qkv.d(), c, rout, rlse);
  expect_close(out.v, rout, 1e-5, "out");
  expect_close(lse.v, rlse, 1e-6, "lse");
}

TEST_P(OpsAttention, BackwardMatchesDouble) {
  const AttentionCase c = GetParam();
  std::mt19937 rng(502);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2),
          dout = random_f32({c.B * c.S, c.nq * c.d}, rng);
  HostF32 out({c.B * c.S, c.nq * c.d}), lse({c.B, c.nq, c.S});
  HostF32 dqkv({c.B * c.S, width(c)}, NAN);  // must be fully overwritten
  attention_forward(cpu_ctx(false), out.t(), lse.t(), qkv.t(), shape_of(c));
  attention_backward(cpu_ctx(false), dqkv.t(), dout.t(), out.t(), lse.t(), qkv.t(), shape_of(c));
  expect_close(dqkv.v, ref_backward(qkv.d(), dout.d(), c), 1e-5, "dqkv");
}

TEST_P(OpsAttention, GradientMatchesFiniteDifferences) {
  const AttentionCase c = GetParam();
  std::mt19937 rng(503);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2),
          dout = random_f32({c.B * c.S, c.nq * c.d}, rng);
  const std::vector<double> gd = dout.d();
  const auto loss = [&](const std::vector<double>& xv) {
    std::vector<double> o, l;
    ref_forward(xv, c, o, l);
    return dot(o, gd);
  };
  const std::vector<double> fd = finite_diff(loss, qkv.d());
  expect_close(ref_backward(qkv.d(), gd, c), fd, 1e-7, "reference dqkv vs finite differences");
  HostF32 out({c.B * c.S, c.nq * c.d}), lse({c.B, c.nq, c.S}), dqkv({c.B * c.S, width(c)});
  attention_forward(cpu_ctx(false), out.t(), lse.t(), qkv.t(), shape_of(c));
  attention_backward(cpu_ctx(false), dqkv.t(), dout.t(), out.t(), lse.t(), qkv.t(), shape_of(c));
  expect_close(dqkv.v, fd, 1e-5, "op dqkv vs finite differences");
}


// The engines whose attention paths a test runs: FP32 BLAS (the FP32 path) and, in a build with oneDNN, oneDNN
// with whatever implementation it picks (the BF16-GEMM path, also on an AVX-512 CI machine without BF16
// instructions; oneDNN 2.6 has no BF16 matmul on an AVX2-only CPU, which tests the FP32 path alone).
std::vector<GemmEngineOverride> attention_engines() {
  if (!cpu::onednn_bf16_matmul_exists()) return {GemmEngineOverride::Fp32Blas};
  return {GemmEngineOverride::Fp32Blas, GemmEngineOverride::OneDnnAnyImpl};
}

struct Bf16Run {
  HostF32 out, lse, dqkv;
};

// Forward and backward with BF16 activations (round_bf16) on `threads` OpenMP threads.
Bf16Run run_bf16(const AttentionCase& c, HostF32& qkv, HostF32& dout, int threads) {
  Bf16Run r{HostF32({c.B * c.S, c.nq * c.d}), HostF32({c.B, c.nq, c.S}), HostF32({c.B * c.S, width(c)}, NAN)};
  ScopedThreads scoped(threads);
  attention_forward(cpu_ctx(true), r.out.t(), r.lse.t(), qkv.t(), shape_of(c));
  attention_backward(cpu_ctx(true), r.dqkv.t(), dout.t(), r.out.t(), r.lse.t(), qkv.t(), shape_of(c));
  return r;
}

// BF16 inputs in [-2, 2] (dout in [-1, 1]) through the engine in force, against the double reference:
//   out  — its BF16 rounding (<= 2^-9·|out|) and, on the BF16-GEMM path, P's: each term p_j·v_j of Σ_j p_j v_j
//          off by <= 2^-9·p_j·|v_j|, so <= 2^-9·max|v| per element (Σ p_j = 1). Checked within 2^-7·|ref|
//          + 2·2^-9·max|v| (bounds doubled), the second term only where P is rounded.
//   lse  — FP32 throughout, not rounded: 1e-6 norm-wise.
//   dqkv — the backward reads the rounded out (as on the GPU), so D = dO·O carries BF16 error, and dQ, dK, dV
//          round once more at the end; P and dS, rounded on the BF16-GEMM path, add 2^-9 per term of their
//          sums. Norm-wise: within 2^-7·|ref| + 1e-2·max|ref| (measured at most 4e-3·max|ref| on both paths).
void expect_bf16_matches_double(const AttentionCase& c, const HostF32& qkv, const HostF32& dout, const Bf16Run& r,
                                bool p_rounded) {
  expect_bf16_representable(r.out.v, "out");
  expect_bf16_representable(r.dqkv.v, "dqkv");
  std::vector<double> rout, rlse;
  ref_forward(qkv.d(), c, rout, rlse);
  double max_v = 0;
  for (int64_t row = 0; row < c.B * c.S; ++row)
    for (int64_t e = (c.nq + c.nkv) * c.d; e < width(c); ++e)  // the V columns
      max_v = std::max(max_v, std::abs(double(qkv.v[row * width(c) + e])));
  const double abs_frac = p_rounded ? 2.0 * 0x1p-9 * max_v / max_abs(rout) : 1e-4;
  expect_bf16_close(r.out.v, rout, "out", 1.0 / 128, abs_frac);
  expect_close(r.lse.v, rlse, 1e-6, "lse (fp32, not rounded)");
  expect_bf16_close(r.dqkv.v, ref_backward(qkv.d(), dout.d(), c), "dqkv", 1.0 / 128, 1e-2);
}

// The engine this machine picks (the BF16-GEMM path where the CPU has BF16 dot products).
TEST_P(OpsAttention, RoundBf16) {
  const AttentionCase c = GetParam();
  std::mt19937 rng(504);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2, true);
  HostF32 dout = random_f32({c.B * c.S, c.nq * c.d}, rng, -1, 1, true);
  expect_bf16_matches_double(c, qkv, dout, run_bf16(c, qkv, dout, 2), cpu::cpu_gemm_engine().onednn_bf16);
}

// Both paths, forced: each matches the double reference, gives the same bits on 1 and 2 threads, and the
// FP32 path leaves P unrounded (its out within the tight bound).
void expect_both_paths_match_double_on_any_thread_count(const AttentionCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2, true);
  HostF32 dout = random_f32({c.B * c.S, c.nq * c.d}, rng, -1, 1, true);
  for (GemmEngineOverride o : attention_engines()) {
    SCOPED_TRACE(o == GemmEngineOverride::Fp32Blas ? "FP32 BLAS engine: FP32 path" : "oneDNN: BF16-GEMM path");
    EngineScope engine(o);
    const Bf16Run one = run_bf16(c, qkv, dout, 1), two = run_bf16(c, qkv, dout, 2);
    expect_bf16_matches_double(c, qkv, dout, two, o != GemmEngineOverride::Fp32Blas);
    EXPECT_TRUE(bitwise_equal(one.out.v, two.out.v));
    EXPECT_TRUE(bitwise_equal(one.lse.v, two.lse.v));
    EXPECT_TRUE(bitwise_equal(one.dqkv.v, two.dqkv.v));
  }
}

TEST_P(OpsAttention, BothPathsMatchDoubleAndAreIndependentOfThreadCount) {
  expect_both_paths_match_double_on_any_thread_count(GetParam(), 507);
}

TEST_P(OpsAttention, IndependentOfThreadCount) {
  const AttentionCase c = GetParam();
  std::mt19937 rng(505);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2),
          dout = random_f32({c.B * c.S, c.nq * c.d}, rng);
  HostF32 out[2] = {HostF32({c.B * c.S, c.nq * c.d}), HostF32({c.B * c.S, c.nq * c.d})};
  HostF32 lse[2] = {HostF32({c.B, c.nq, c.S}), HostF32({c.B, c.nq, c.S})};
  HostF32 dqkv[2] = {HostF32({c.B * c.S, width(c)}), HostF32({c.B * c.S, width(c)})};
  for (int r = 0; r < 2; ++r) {
    ScopedThreads threads(r + 1);
    attention_forward(cpu_ctx(true), out[r].t(), lse[r].t(), qkv.t(), shape_of(c));
    attention_backward(cpu_ctx(true), dqkv[r].t(), dout.t(), out[r].t(), lse[r].t(), qkv.t(), shape_of(c));
  }
  EXPECT_TRUE(bitwise_equal(out[0].v, out[1].v));
  EXPECT_TRUE(bitwise_equal(lse[0].v, lse[1].v));
  EXPECT_TRUE(bitwise_equal(dqkv[0].v, dqkv[1].v));
}

// GQA groups of 2 and 3, MHA, MQA; B > 1; sequence lengths that are not powers of two.
INSTANTIATE_TEST_SUITE_P(Shapes, OpsAttention,
                         ::testing::Values(AttentionCase{2, 7, 4, 2, 8}, AttentionCase{1, 13, 6, 2, 16}, AttentionCase{3, 5, 2, 2, 4},
                                           AttentionCase{2, 9, 4, 1, 8}));

// Several query and key tiles of 64 (the last one partial) with a GQA group of 2 and head dim 64 (the
// model's), through both paths: against the double reference and the same bits on 1 and 2 threads.
TEST(OpsAttentionLong, BothPathsOverSeveralTiles) {
  expect_both_paths_match_double_on_any_thread_count(AttentionCase{1, 150, 4, 2, 64}, 508);
}

TEST(OpsAttentionLong, ForwardBackwardMatchDouble) {
  const AttentionCase c{2, 130, 4, 2, 32};
  std::mt19937 rng(506);
  HostF32 qkv = random_f32({c.B * c.S, width(c)}, rng, -2, 2),
          dout = random_f32({c.B * c.S, c.nq * c.d}, rng);
  HostF32 out({c.B * c.S, c.nq * c.d}), lse({c.B, c.nq, c.S}), dqkv({c.B * c.S, width(c)});
  attention_forward(cpu_ctx(false), out.t(), lse.t(), qkv.t(), shape_of(c));
  attention_backward(cpu_ctx(false), dqkv.t(), dout.t(), out.t(), lse.t(), qkv.t(), shape_of(c));
  std::vector<double> rout, rlse;
  ref_forward(qkv.d(), c, rout, rlse);
  expect_close(out.v, rout, 1e-5, "out");
  expect_close(lse.v, rlse, 1e-6, "lse");
  expect_close(dqkv.v, ref_backward(qkv.d(), dout.d(), c), 1e-5, "dqkv");
}

TEST(OpsAttentionErrors, ErrorsNameTheOp) {
  const AttentionCase c{2, 7, 4, 2, 8};
  HostF32 qkv({c.B * c.S, width(c)}), out({c.B * c.S, c.nq * c.d}), lse({c.B, c.nq, c.S});
  HostF32 lse_bad({c.B, c.S, c.nq}), out_bad({c.B * c.S, c.nq * c.d + 1});
  const OpContext ctx = cpu_ctx(false);
  expect_error_naming("attention_forward",
                      [&] { attention_forward(ctx, out.t(), lse_bad.t(), qkv.t(), shape_of(c)); });
  expect_error_naming("attention_forward",
                      [&] { attention_forward(ctx, out_bad.t(), lse.t(), qkv.t(), shape_of(c)); });
  expect_error_naming("attention_forward", [&] {
    attention_forward(ctx, out.t(), lse.t(), qkv.t(), AttentionShape{2, 7, 4, 3, 8});
  });
  expect_error_naming("attention_backward", [&] {
    attention_backward(ctx, qkv.t(), out_bad.t(), out.t(), lse.t(), qkv.t(), shape_of(c));
  });
}

// ---- CUDA: the same op on the GPU (cuDNN) against the CPU backend -------------------------------
// GPU conformance of causal GQA attention (backend/cuda/attention.cpp, cuDNN's fused SDPA through
// cudnn-frontend) against the CPU backend on fresh random inputs (cuda/cuda_test_util.h), in both layouts
// the op may build (attention_graph.h: strided views of the qkv rows, and packed Q/K/V copies, forced by
// the test switch ForcePackedAttention). Shapes: B=2, nq=8, nkv=2 (GQA groups of 4), d in {64, 128},
// S in {128, 256}, and llama_tiny's head dim 32; and the production shape of Llama 3 8B at the playbook's sequence (B=1, S=4096,
// nq=32, nkv=8, d=128) with both backward algorithms (the default non-deterministic one and
// --deterministic-mode's). Compiled in every build; the device tests skip with the reason when there is no CUDA
// device. CudaAttentionArgs (argument checks come before any GPU call) and CudaAttentionGraph (the
// frontend's validation of the cuDNN graphs for sm_90/sm_100/sm_103 targets) run without a GPU.
//
// Tolerances. The two backends do not run the same arithmetic:
//   * cuDNN's flash kernel rounds the probabilities P to BF16 before P·V (and dS, P to BF16 before the
//     backward GEMMs). On a CPU whose GEMM engine is oneDNN BF16 the CPU does the same (its BF16-GEMM
//     path, backend/cpu/attention_bf16.cpp), but the two roundings are of FP32 values that already differ
//     in their last bits (next point), so they can land one BF16 ulp apart: per term still up to 2^-9
//     relative, not less. On the CPU's FP32 path (a CPU without BF16 dot products) P and dS stay FP32 and
//     the GPU's roundings are the whole difference. Either way one BF16 rounding is a relative error
//     <= 2^-9 per term, so a sum of n terms with random signs is off by about 2^-9 of its L2 size, with
//     a worst case of 2^-9 · Σ|terms|: the same bounds serve both CPU paths, so they stay as they were
//     (the typical error is smaller against the BF16-GEMM path: most terms now round to the same BF16).
//   * accumulation order differs (tiles, online softmax rescaling, exp2 with a folded log2 e), which is
//     FP32-level noise (~1e-6 relative) in scores, lse and the sums;
//   * both sides round their BF16 outputs, so the same exact value can land one BF16 ulp apart
//     (<= 2^-8 relative).
// Hence, per output (and per Q/K/V part of dqkv): the relative L2 error ||gpu - cpu|| / ||cpu|| must
// be below 1e-2 (expected ~3e-3: a few 2^-9 contributions), and the largest element error below
// 2e-2 · max|cpu| (the worst-case bound above, with the max output as the scale of Σ|terms|).
// lse is FP32 on both sides from the same BF16 inputs: |gpu - cpu| <= 2e-3 absolute (values are
// ~log S + O(1) <= 10, so this allows ~2e-4 relative: a wrong base, scale or mask shifts lse by O(1)).
// Every bug these tests exist for — a wrong mask, scale, LSE convention, GQA head mapping or stride —
// moves results by O(1), far outside these bounds.
namespace gpu {

// n BF16-representable values ~ N(0, stddev²).
std::vector<float> attention_random_bf16(std::mt19937& rng, size_t n, float stddev) {
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = num::round_bf16(nd(rng));
  return v;
}

struct AttentionCase {
  int64_t B, S, nq, nkv, d;
  AttentionShape shape() const { return AttentionShape{B, S, nq, nkv, d}; }
  int64_t T() const { return B * S; }
  int64_t W() const { return (nq + 2 * nkv) * d; }
  std::string name() const {
    return "B=" + std::to_string(B) + " S=" + std::to_string(S) + " nq=" + std::to_string(nq) +
           " nkv=" + std::to_string(nkv) + " d=" + std::to_string(d);
  }
};

const AttentionCase kAttentionCases[] = {{2, 128, 8, 2, 64}, {2, 256, 8, 2, 64}, {2, 128, 8, 2, 128}, {2, 256, 8, 2, 128},
                                         {2, 128, 8, 2, 32}};

// The layouts a GPU test runs: the one cuDNN accepts first (strided views, unless refused), then the
// packed copies (DeviceState::force_packed_attention), so one GPU checks both.
struct ForcePackedAttention {
  explicit ForcePackedAttention(bool on) { set(on); }
  ~ForcePackedAttention() { set(false); }
  ForcePackedAttention(const ForcePackedAttention&) = delete;
  ForcePackedAttention& operator=(const ForcePackedAttention&) = delete;
  static void set(bool on) {
#if defined(PL_WITH_CUDA)
    if (test::cuda_ctx().gpu != nullptr) test::cuda_ctx().gpu->force_packed_attention = on;
#else
    (void)on;
#endif
  }
};

// Which layout the graphs for `c` were built in under the current switches (checked: the packed switch
// must give the packed layout).
std::string layout_trace(const AttentionCase& c, bool packed) {
#if defined(PL_WITH_CUDA)
  const cuda::AttentionPlan plan = cuda::attention_prepare(*test::cuda_ctx().gpu, c.shape());
  if (packed) {
    EXPECT_EQ(plan.forward_layout, cuda::AttentionLayout::Packed);
    EXPECT_EQ(plan.backward_layout, cuda::AttentionLayout::Packed);
    EXPECT_GE(plan.pack_scratch_allocated, 2 * c.T() * c.W() * 2) << "the pack scratch: Q/K/V and dQ/dK/dV";
  } else if (!plan.strided_refusal.empty()) {
    std::printf("[ info ] %s: cuDNN refused the strided views: %s\n", c.name().c_str(), plan.strided_refusal.c_str());
  }
  return c.name() + ", forward on " + cuda::attention_layout_name(plan.forward_layout) + ", backward on " +
         cuda::attention_layout_name(plan.backward_layout);
#else
  return c.name() + (packed ? " packed" : " strided");
#endif
}

// Relative L2 and max errors of columns [c0, c1) of two row-major [rows, cols] matrices.
void attention_expect_close(const std::vector<float>& got, const std::vector<float>& ref, int64_t rows, int64_t cols,
                            int64_t c0, int64_t c1, const std::string& what) {
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  int64_t worst = -1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i = r * cols + c;
      const double e = std::abs(double(got[i]) - double(ref[i]));
      err2 += e * e;
      ref2 += double(ref[i]) * ref[i];
      max_ref = std::max(max_ref, std::abs(double(ref[i])));
      if (!(e <= max_err)) {  // also catches NaN
        max_err = std::isnan(e) ? INFINITY : e;
        worst = i;
      }
    }
  const double rel_l2 = std::sqrt(err2 / std::max(ref2, 1e-30));
  ASSERT_GT(max_ref, 0.0) << what << ": reference is all zeros";
  EXPECT_LE(rel_l2, 1e-2) << what << ": relative L2 error";
  EXPECT_LE(max_err, 2e-2 * max_ref) << what << ": largest error at element " << worst << " (gpu "
                                     << got[worst] << ", cpu " << ref[worst] << "), max|cpu| " << max_ref;
}

struct CpuForward {
  std::vector<float> out, lse;
};

CpuForward cpu_forward(std::vector<float>& qkv, const AttentionCase& c) {
  CpuForward f{std::vector<float>(static_cast<size_t>(c.T() * c.nq * c.d)),
               std::vector<float>(static_cast<size_t>(c.B * c.nq * c.S))};
  attention_forward(cpu_ctx(true), host_view(f.out, {c.T(), c.nq * c.d}), host_view(f.lse, {c.B, c.nq, c.S}),
                    host_view(qkv, {c.T(), c.W()}), c.shape());
  return f;
}

TEST(CudaAttention, ForwardMatchesCpuOutAndLseInBothLayouts) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  for (bool packed : {false, true})
  for (const AttentionCase& c : kAttentionCases) {
    ForcePackedAttention layout(packed);
    SCOPED_TRACE(layout_trace(c, packed));
    std::vector<float> qkv = attention_random_bf16(rng, static_cast<size_t>(c.T() * c.W()), 1.0f);
    const CpuForward ref = cpu_forward(qkv, c);

    auto dqkv = to_device(qkv, {c.T(), c.W()}, DType::BF16);
    auto dout = test::device_tensor({c.T(), c.nq * c.d}, DType::BF16);
    auto dlse = test::device_tensor({c.B, c.nq, c.S}, DType::F32);
    attention_forward(cuda_ctx(), dout.t, dlse.t, dqkv.t, c.shape());
    const std::vector<float> out = to_host_floats(dout.t), lse = to_host_floats(dlse.t);

    attention_expect_close(out, ref.out, c.T(), c.nq * c.d, 0, c.nq * c.d, "out");
    double max_lse_err = 0;
    size_t worst = 0;
    for (size_t i = 0; i < lse.size(); ++i) {
      const double e = std::abs(double(lse[i]) - double(ref.lse[i]));
      if (!(e <= max_lse_err)) {
        max_lse_err = std::isnan(e) ? INFINITY : e;
        worst = i;
      }
    }
    EXPECT_LE(max_lse_err, 2e-3) << "lse: largest error at [b*nq+h, i] index " << worst << " (gpu " << lse[worst]
                                 << ", cpu " << ref.lse[worst] << "); natural-log LSE of the scaled scores expected";
  }
}

// The backward gets the CPU forward's out and lse on both sides, so it is compared alone.
TEST(CudaAttention, BackwardMatchesCpuDqkvInBothLayouts) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  for (bool packed : {false, true})
  for (const AttentionCase& c : kAttentionCases) {
    ForcePackedAttention layout(packed);
    SCOPED_TRACE(layout_trace(c, packed));
    std::vector<float> qkv = attention_random_bf16(rng, static_cast<size_t>(c.T() * c.W()), 1.0f);
    std::vector<float> gout = attention_random_bf16(rng, static_cast<size_t>(c.T() * c.nq * c.d), 1.0f);
    CpuForward f = cpu_forward(qkv, c);  // out is BF16-rounded (round_bf16), so exact on the device
    std::vector<float> ref(qkv.size());
    attention_backward(cpu_ctx(true), host_view(ref, {c.T(), c.W()}), host_view(gout, {c.T(), c.nq * c.d}),
                       host_view(f.out, {c.T(), c.nq * c.d}), host_view(f.lse, {c.B, c.nq, c.S}),
                       host_view(qkv, {c.T(), c.W()}), c.shape());

    auto d_qkv = to_device(qkv, {c.T(), c.W()}, DType::BF16);
    auto d_gout = to_device(gout, {c.T(), c.nq * c.d}, DType::BF16);
    auto d_out = to_device(f.out, {c.T(), c.nq * c.d}, DType::BF16);
    auto d_lse = to_device(f.lse, {c.B, c.nq, c.S}, DType::F32);
    // Poison dqkv: the op must overwrite every element.
    auto d_dqkv = to_device(std::vector<float>(qkv.size(), NAN), {c.T(), c.W()}, DType::BF16);
    attention_backward(cuda_ctx(), d_dqkv.t, d_gout.t, d_out.t, d_lse.t, d_qkv.t, c.shape());
    const std::vector<float> got = to_host_floats(d_dqkv.t);

    const int64_t qd = c.nq * c.d, kd = c.nkv * c.d;
    attention_expect_close(got, ref, c.T(), c.W(), 0, qd, "dq");
    attention_expect_close(got, ref, c.T(), c.W(), qd, qd + kd, "dk");
    attention_expect_close(got, ref, c.T(), c.W(), qd + kd, qd + 2 * kd, "dv");
  }
}

// Sets the attention backward's determinism mode for one scope (the default is non-deterministic).
struct DeterministicMode {
  explicit DeterministicMode(bool on) {
#if defined(PL_WITH_CUDA)
    test::cuda_ctx().gpu->deterministic_attention = on;
#else
    (void)on;
#endif
  }
  ~DeterministicMode() {
#if defined(PL_WITH_CUDA)
    test::cuda_ctx().gpu->deterministic_attention = false;
#endif
  }
};

// Production shape (Llama 3 8B at the playbook's sequence: seq 4096, 32 query / 8 KV heads, head dim
// 128, micro-batch 1), in both layouts: forward, and backward in both algorithms (the default non-deterministic one and
// --deterministic-mode's), against the CPU within the tolerances above. The CPU reference (~70 GFLOP
// forward, ~2.5x that backward) is computed once.
TEST(CudaAttention, ProductionShapeMatchesCpuForwardAndBothBackwards) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const AttentionCase c{1, 4096, 32, 8, 128};
  SCOPED_TRACE(c.name());
  std::vector<float> qkv = attention_random_bf16(rng, static_cast<size_t>(c.T() * c.W()), 1.0f);
  std::vector<float> gout = attention_random_bf16(rng, static_cast<size_t>(c.T() * c.nq * c.d), 1.0f);
  const CpuForward f = cpu_forward(qkv, c);
  std::vector<float> ref(qkv.size());
  {
    std::vector<float> out = f.out, lse = f.lse;
    attention_backward(cpu_ctx(true), host_view(ref, {c.T(), c.W()}), host_view(gout, {c.T(), c.nq * c.d}),
                       host_view(out, {c.T(), c.nq * c.d}), host_view(lse, {c.B, c.nq, c.S}),
                       host_view(qkv, {c.T(), c.W()}), c.shape());
  }
  auto d_qkv = to_device(qkv, {c.T(), c.W()}, DType::BF16);
  auto d_out = test::device_tensor({c.T(), c.nq * c.d}, DType::BF16);
  auto d_lse = test::device_tensor({c.B, c.nq, c.S}, DType::F32);
  // The backward gets the CPU forward's out and lse, as in BackwardMatchesCpuDqkv.
  auto d_gout = to_device(gout, {c.T(), c.nq * c.d}, DType::BF16);
  auto d_cpu_out = to_device(f.out, {c.T(), c.nq * c.d}, DType::BF16);
  auto d_cpu_lse = to_device(f.lse, {c.B, c.nq, c.S}, DType::F32);
  for (bool packed : {false, true}) {
    ForcePackedAttention layout(packed);
    SCOPED_TRACE(packed ? "packed Q/K/V copies" : "the layout cuDNN accepts first (strided views)");
    attention_forward(cuda_ctx(), d_out.t, d_lse.t, d_qkv.t, c.shape());
    attention_expect_close(to_host_floats(d_out.t), f.out, c.T(), c.nq * c.d, 0, c.nq * c.d, "out");
    const std::vector<float> lse = to_host_floats(d_lse.t);
    double max_lse_err = 0;
    for (size_t i = 0; i < lse.size(); ++i) {
      const double e = std::abs(double(lse[i]) - double(f.lse[i]));
      max_lse_err = std::isnan(e) ? INFINITY : std::max(max_lse_err, e);
    }
    EXPECT_LE(max_lse_err, 2e-3) << "lse";

    for (bool deterministic : {false, true}) {
      SCOPED_TRACE(deterministic ? "deterministic backward" : "default (non-deterministic) backward");
      DeterministicMode mode(deterministic);
#if defined(PL_WITH_CUDA)
      const cuda::AttentionPlan plan = cuda::attention_prepare(*test::cuda_ctx().gpu, c.shape());
      EXPECT_EQ(plan.deterministic_requested, deterministic);
      std::printf("[ info ] %s: backward %s on %s, workspace forward %.1f MiB, backward %.1f MiB%s%s\n",
                  c.name().c_str(), plan.deterministic_backward ? "deterministic" : "non-deterministic",
                  cuda::attention_layout_name(plan.backward_layout), double(plan.forward_workspace) / 1048576.0,
                  double(plan.backward_workspace) / 1048576.0, plan.strided_refusal.empty() ? "" : "; strided: ",
                  plan.strided_refusal.c_str());
#endif
      auto d_dqkv = to_device(std::vector<float>(qkv.size(), NAN), {c.T(), c.W()}, DType::BF16);
      attention_backward(cuda_ctx(), d_dqkv.t, d_gout.t, d_cpu_out.t, d_cpu_lse.t, d_qkv.t, c.shape());
      const std::vector<float> got = to_host_floats(d_dqkv.t);
      const int64_t qd = c.nq * c.d, kd = c.nkv * c.d;
      attention_expect_close(got, ref, c.T(), c.W(), 0, qd, "dq");
      attention_expect_close(got, ref, c.T(), c.W(), qd, qd + kd, "dk");
      attention_expect_close(got, ref, c.T(), c.W(), qd + kd, qd + 2 * kd, "dv");
    }
  }
}

// With --deterministic-mode the op asks cuDNN for its deterministic backward (attention.cpp); two runs
// must give the same bits. If this fails, attention.cpp printed a notice that cuDNN fell back to the
// non-deterministic one.
TEST(CudaAttention, ForwardAndBackwardAreDeterministic) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  DeterministicMode mode(true);
#if defined(PL_WITH_CUDA)
  EXPECT_TRUE(cuda::attention_prepare(*test::cuda_ctx().gpu, AttentionShape{2, 256, 8, 2, 128}).deterministic_backward)
      << "cuDNN refused the deterministic backward for this shape";
#endif
  const AttentionCase c{2, 256, 8, 2, 128};
  SCOPED_TRACE(c.name());
  const std::vector<float> qkv = attention_random_bf16(rng, static_cast<size_t>(c.T() * c.W()), 1.0f);
  const std::vector<float> gout = attention_random_bf16(rng, static_cast<size_t>(c.T() * c.nq * c.d), 1.0f);
  auto d_qkv = to_device(qkv, {c.T(), c.W()}, DType::BF16);
  auto d_gout = to_device(gout, {c.T(), c.nq * c.d}, DType::BF16);
  auto d_out = test::device_tensor({c.T(), c.nq * c.d}, DType::BF16);
  auto d_lse = test::device_tensor({c.B, c.nq, c.S}, DType::F32);
  auto d_dqkv = test::device_tensor({c.T(), c.W()}, DType::BF16);
  std::vector<uint8_t> first[3];
  for (int run = 0; run < 2; ++run) {
    attention_forward(cuda_ctx(), d_out.t, d_lse.t, d_qkv.t, c.shape());
    attention_backward(cuda_ctx(), d_dqkv.t, d_gout.t, d_out.t, d_lse.t, d_qkv.t, c.shape());
    const std::vector<uint8_t> now[3] = {test::to_host_bytes(d_out.t), test::to_host_bytes(d_lse.t),
                                         test::to_host_bytes(d_dqkv.t)};
    for (int k = 0; k < 3; ++k) {
      if (run == 0)
        first[k] = now[k];
      else
        EXPECT_TRUE(first[k] == now[k]) << (k == 0 ? "out" : k == 1 ? "lse" : "dqkv") << " differs between runs";
    }
  }
}

// Argument checks come before any CUDA or cuDNN call, so they run on every machine of a CUDA build.
TEST(CudaAttentionArgs, RejectsBadTensorsBeforeTouchingTheGpu) {
#if !defined(PL_WITH_CUDA)
  GTEST_SKIP() << "this build has no CUDA backend";
#else
  const AttentionCase c{2, 128, 8, 2, 64};
  alignas(256) static uint8_t fake[16];  // never dereferenced: the checks reject the call first
  void* p = fake;
  const Tensor qkv(p, {c.T(), c.W()}, DType::BF16, Device::CUDA);
  const Tensor out(p, {c.T(), c.nq * c.d}, DType::BF16, Device::CUDA);
  const Tensor lse(p, {c.B, c.nq, c.S}, DType::F32, Device::CUDA);
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  // lse in BF16
  std::string m = message([&] {
    attention_forward(cuda_ctx(), out, Tensor(p, {c.B, c.nq, c.S}, DType::BF16, Device::CUDA), qkv, c.shape());
  });
  EXPECT_NE(m.find("attention_forward: lse must be a f32 CUDA tensor"), std::string::npos) << m;
  // qkv too narrow for the shape (nkv counted once)
  m = message([&] {
    attention_forward(cuda_ctx(), out, lse, Tensor(p, {c.T(), (c.nq + c.nkv) * c.d}, DType::BF16, Device::CUDA),
                      c.shape());
  });
  EXPECT_NE(m.find("qkv must be a bf16 CUDA tensor of shape [256, 768]"), std::string::npos) << m;
  // nq not a multiple of nkv
  m = message([&] { attention_forward(cuda_ctx(), out, lse, qkv, AttentionShape{2, 128, 8, 3, 64}); });
  EXPECT_NE(m.find("q_heads must be a multiple of kv_heads"), std::string::npos) << m;
  // head_dim not a multiple of 8 (cuDNN's rule)
  m = message([&] { attention_forward(cuda_ctx(), out, lse, qkv, AttentionShape{2, 128, 8, 2, 60}); });
  EXPECT_NE(m.find("head_dim a multiple of 8"), std::string::npos) << m;
  // a CPU tensor given to the backward
  std::vector<float> host(static_cast<size_t>(c.T() * c.W()));
  m = message([&] {
    attention_backward(cuda_ctx(), Tensor(host.data(), {c.T(), c.W()}, DType::BF16, Device::CPU), out, out, lse,
                       qkv, c.shape());
  });
  EXPECT_NE(m.find("attention_backward: dqkv must be a bf16 CUDA tensor"), std::string::npos) << m;
#endif
}

// The frontend's validation of the graphs the ops build (tensors, strides, GQA, causal band, stats,
// deterministic backward) for Hopper and Blackwell targets. Needs no GPU: the target architecture is
// given instead of read from a device (attention_graph.h).
TEST(CudaAttentionGraph, ValidatesForHopperAndBlackwellWithoutAGpu) {
#if !defined(PL_WITH_CUDA)
  GTEST_SKIP() << "this build has no CUDA backend";
#else
  if (!cuda::attention_has_cudnn_frontend()) GTEST_SKIP() << "this build has no cudnn-frontend headers";
  for (int sm : {90, 100, 103})
    for (bool backward : {false, true})
      for (const AttentionCase& c : kAttentionCases) {
        for (bool deterministic : {false, true}) {
          if (!backward && deterministic) continue;
          for (auto layout : {cuda::AttentionLayout::Strided, cuda::AttentionLayout::Packed}) {
            const std::string why = cuda::attention_validate_graph(c.shape(), backward, sm, deterministic, layout);
            EXPECT_EQ(why, "") << c.name() << " sm " << sm << (backward ? " backward" : " forward")
                               << (deterministic ? " deterministic" : "") << " on "
                               << cuda::attention_layout_name(layout);
          }
        }
      }
  // The production shape (8B layers at seq 4096), both backward algorithms.
  for (int sm : {90, 100})
    for (bool deterministic : {false, true})
      EXPECT_EQ(cuda::attention_validate_graph(AttentionShape{1, 4096, 32, 8, 128}, true, sm, deterministic), "")
          << "sm " << sm << (deterministic ? " deterministic" : "");
  // Also MHA (nkv = nq), MQA (nkv = 1) and a sequence that is not a multiple of the tile sizes.
  for (const AttentionShape s : {AttentionShape{1, 64, 4, 4, 64}, AttentionShape{3, 100, 8, 1, 128}})
    for (bool backward : {false, true})
      EXPECT_EQ(cuda::attention_validate_graph(s, backward, 90), "") << (backward ? "backward" : "forward");
  // The target is really the one given: head_dim 256 backward is Hopper-only (cuDNN's Blackwell limit is 128).
  const AttentionShape d256{2, 128, 8, 2, 256};
  EXPECT_EQ(cuda::attention_validate_graph(d256, true, 90), "");
  EXPECT_NE(cuda::attention_validate_graph(d256, true, 100), "");
  // And the frontend's own GQA rule, reached only through this hook (the ops check it first).
  EXPECT_NE(cuda::attention_validate_graph(AttentionShape{2, 128, 8, 3, 64}, false, 90).find("group-query"),
            std::string::npos);
#endif
}

}  // namespace gpu
}  // namespace
}  // namespace pl::optest
