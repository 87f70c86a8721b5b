// GPU conformance of causal GQA attention (backend/cuda/attention.cpp, cuDNN's fused SDPA through
// cudnn-frontend) against the CPU backend (ctx.device CPU, round_bf16 true, FP32 storage) on fresh
// random BF16-representable inputs — the seed comes from std::random_device, or from PL_TEST_SEED when
// set, and is printed with every failure. Shapes: B=2, nq=8, nkv=2 (GQA groups of 4), d in {64, 128},
// S in {128, 256}; and the production shape of Llama 3 8B at the playbook's sequence (B=1, S=4096,
// nq=32, nkv=8, d=128) with both backward algorithms (the default non-deterministic one and
// --deterministic-mode's). Compiled in every build; the device tests skip with the reason when there is no CUDA
// device. CudaAttentionArgs (argument checks come before any GPU call) and CudaAttentionGraph (the
// frontend's validation of the cuDNN graphs for sm_90/sm_100/sm_103 targets) run without a GPU.
//
// Tolerances. The two backends do not run the same arithmetic:
//   * cuDNN's flash kernel rounds the probabilities P to BF16 before P·V (and dS, P to BF16 before the
//     backward GEMMs); the CPU keeps them in FP32. One BF16 rounding is a relative error <= 2^-9 per
//     term, so a sum of n terms with random signs is off by about 2^-9 of its L2 size, with a worst
//     case of 2^-9 · Σ|terms|.
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
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/tensor.h"
#include "cuda/cuda_test_util.h"
#include "numerics/bf16.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/attention_graph.h"
#endif

namespace pl {
namespace {

using test::cuda_ctx;
using test::host_view;
using test::to_device;
using test::to_host_floats;

uint32_t fresh_seed() {
  if (const char* s = std::getenv("PL_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}

#define PL_SEEDED_RNG(rng)                                                             \
  const uint32_t seed_ = fresh_seed();                                                 \
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (rerun with PL_TEST_SEED=" +        \
               std::to_string(seed_) + ")");                                           \
  std::mt19937 rng(seed_)

// n BF16-representable values ~ N(0, stddev²).
std::vector<float> random_bf16(std::mt19937& rng, size_t n, float stddev) {
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = num::round_bf16(nd(rng));
  return v;
}

struct Case {
  int64_t B, S, nq, nkv, d;
  AttentionShape shape() const { return AttentionShape{B, S, nq, nkv, d}; }
  int64_t T() const { return B * S; }
  int64_t W() const { return (nq + 2 * nkv) * d; }
  std::string name() const {
    return "B=" + std::to_string(B) + " S=" + std::to_string(S) + " nq=" + std::to_string(nq) +
           " nkv=" + std::to_string(nkv) + " d=" + std::to_string(d);
  }
};

const Case kCases[] = {{2, 128, 8, 2, 64}, {2, 256, 8, 2, 64}, {2, 128, 8, 2, 128}, {2, 256, 8, 2, 128}};

// Relative L2 and max errors of columns [c0, c1) of two row-major [rows, cols] matrices.
void expect_close(const std::vector<float>& got, const std::vector<float>& ref, int64_t rows, int64_t cols,
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

CpuForward cpu_forward(std::vector<float>& qkv, const Case& c) {
  CpuForward f{std::vector<float>(static_cast<size_t>(c.T() * c.nq * c.d)),
               std::vector<float>(static_cast<size_t>(c.B * c.nq * c.S))};
  attention_forward(OpContext{}, host_view(f.out, {c.T(), c.nq * c.d}), host_view(f.lse, {c.B, c.nq, c.S}),
                    host_view(qkv, {c.T(), c.W()}), c.shape());
  return f;
}

TEST(CudaAttention, ForwardMatchesCpuOutAndLse) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name());
    std::vector<float> qkv = random_bf16(rng, static_cast<size_t>(c.T() * c.W()), 1.0f);
    const CpuForward ref = cpu_forward(qkv, c);

    auto dqkv = to_device(qkv, {c.T(), c.W()}, DType::BF16);
    auto dout = test::device_tensor({c.T(), c.nq * c.d}, DType::BF16);
    auto dlse = test::device_tensor({c.B, c.nq, c.S}, DType::F32);
    attention_forward(cuda_ctx(), dout.t, dlse.t, dqkv.t, c.shape());
    const std::vector<float> out = to_host_floats(dout.t), lse = to_host_floats(dlse.t);

    expect_close(out, ref.out, c.T(), c.nq * c.d, 0, c.nq * c.d, "out");
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
TEST(CudaAttention, BackwardMatchesCpuDqkv) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name());
    std::vector<float> qkv = random_bf16(rng, static_cast<size_t>(c.T() * c.W()), 1.0f);
    std::vector<float> gout = random_bf16(rng, static_cast<size_t>(c.T() * c.nq * c.d), 1.0f);
    CpuForward f = cpu_forward(qkv, c);  // out is BF16-rounded (round_bf16), so exact on the device
    std::vector<float> ref(qkv.size());
    attention_backward(OpContext{}, host_view(ref, {c.T(), c.W()}), host_view(gout, {c.T(), c.nq * c.d}),
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
    expect_close(got, ref, c.T(), c.W(), 0, qd, "dq");
    expect_close(got, ref, c.T(), c.W(), qd, qd + kd, "dk");
    expect_close(got, ref, c.T(), c.W(), qd + kd, qd + 2 * kd, "dv");
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
// 128, micro-batch 1): forward, and backward in both algorithms (the default non-deterministic one and
// --deterministic-mode's), against the CPU within the tolerances above. The CPU reference (~70 GFLOP
// forward, ~2.5x that backward) is computed once.
TEST(CudaAttention, ProductionShapeMatchesCpuForwardAndBothBackwards) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const Case c{1, 4096, 32, 8, 128};
  SCOPED_TRACE(c.name());
  std::vector<float> qkv = random_bf16(rng, static_cast<size_t>(c.T() * c.W()), 1.0f);
  std::vector<float> gout = random_bf16(rng, static_cast<size_t>(c.T() * c.nq * c.d), 1.0f);
  const CpuForward f = cpu_forward(qkv, c);
  std::vector<float> ref(qkv.size());
  {
    std::vector<float> out = f.out, lse = f.lse;
    attention_backward(OpContext{}, host_view(ref, {c.T(), c.W()}), host_view(gout, {c.T(), c.nq * c.d}),
                       host_view(out, {c.T(), c.nq * c.d}), host_view(lse, {c.B, c.nq, c.S}),
                       host_view(qkv, {c.T(), c.W()}), c.shape());
  }
  auto d_qkv = to_device(qkv, {c.T(), c.W()}, DType::BF16);
  auto d_out = test::device_tensor({c.T(), c.nq * c.d}, DType::BF16);
  auto d_lse = test::device_tensor({c.B, c.nq, c.S}, DType::F32);
  attention_forward(cuda_ctx(), d_out.t, d_lse.t, d_qkv.t, c.shape());
  expect_close(to_host_floats(d_out.t), f.out, c.T(), c.nq * c.d, 0, c.nq * c.d, "out");
  const std::vector<float> lse = to_host_floats(d_lse.t);
  double max_lse_err = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    const double e = std::abs(double(lse[i]) - double(f.lse[i]));
    max_lse_err = std::isnan(e) ? INFINITY : std::max(max_lse_err, e);
  }
  EXPECT_LE(max_lse_err, 2e-3) << "lse";

  // The backward gets the CPU forward's out and lse, as in BackwardMatchesCpuDqkv.
  auto d_gout = to_device(gout, {c.T(), c.nq * c.d}, DType::BF16);
  auto d_cpu_out = to_device(f.out, {c.T(), c.nq * c.d}, DType::BF16);
  auto d_cpu_lse = to_device(f.lse, {c.B, c.nq, c.S}, DType::F32);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic backward" : "default (non-deterministic) backward");
    DeterministicMode mode(deterministic);
#if defined(PL_WITH_CUDA)
    const cuda::AttentionPlan plan = cuda::attention_prepare(*test::cuda_ctx().gpu, c.shape());
    EXPECT_EQ(plan.deterministic_requested, deterministic);
    std::printf("[ info ] %s: backward %s, workspace forward %.1f MiB, backward %.1f MiB\n", c.name().c_str(),
                plan.deterministic_backward ? "deterministic" : "non-deterministic",
                double(plan.forward_workspace) / 1048576.0, double(plan.backward_workspace) / 1048576.0);
#endif
    auto d_dqkv = to_device(std::vector<float>(qkv.size(), NAN), {c.T(), c.W()}, DType::BF16);
    attention_backward(cuda_ctx(), d_dqkv.t, d_gout.t, d_cpu_out.t, d_cpu_lse.t, d_qkv.t, c.shape());
    const std::vector<float> got = to_host_floats(d_dqkv.t);
    const int64_t qd = c.nq * c.d, kd = c.nkv * c.d;
    expect_close(got, ref, c.T(), c.W(), 0, qd, "dq");
    expect_close(got, ref, c.T(), c.W(), qd, qd + kd, "dk");
    expect_close(got, ref, c.T(), c.W(), qd + kd, qd + 2 * kd, "dv");
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
  const Case c{2, 256, 8, 2, 128};
  SCOPED_TRACE(c.name());
  const std::vector<float> qkv = random_bf16(rng, static_cast<size_t>(c.T() * c.W()), 1.0f);
  const std::vector<float> gout = random_bf16(rng, static_cast<size_t>(c.T() * c.nq * c.d), 1.0f);
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
  const Case c{2, 128, 8, 2, 64};
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
      for (const Case& c : kCases) {
        for (bool deterministic : {false, true}) {
          if (!backward && deterministic) continue;
          const std::string why = cuda::attention_validate_graph(c.shape(), backward, sm, deterministic);
          EXPECT_EQ(why, "") << c.name() << " sm " << sm << (backward ? " backward" : " forward")
                             << (deterministic ? " deterministic" : "");
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

}  // namespace
}  // namespace pl
