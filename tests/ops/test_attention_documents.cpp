// Document-aware attention on the CPU (AttentionShape::docs, --reset-attention-mask): a micro-batch of packed
// documents gives, for every document, what attention gives that document run alone as a sample of its own —
// forward (out, lse) and backward (dq, dk, dv) — on both CPU paths: the FP32 one bit for bit (the same terms
// summed in the same groups), the BF16-GEMM one (oneDNN) within BF16 rounding. Without the boundaries the
// packed result differs. Broken offsets are refused naming the op.
#include "backend/cpu/onednn_gemm.h"
#include "op_test_util.h"

namespace pl::optest {
namespace {

constexpr int64_t kB = 2, kS = 70, kNq = 4, kNkv = 2, kD = 16;
constexpr int64_t kW = (kNq + 2 * kNkv) * kD, kO = kNq * kD, kT = kB * kS;
// Sample 0: documents of 10, 35 and 25 tokens (one crosses the 64-row work blocks); sample 1: 1 and 69.
const std::vector<int32_t> kOffsets{0, 10, 45, 70, 71, 140};

struct Result {
  std::vector<float> out, lse, dqkv;
};

// Forward and backward of `B` samples of `S` tokens (qkv [B*S, W], dout [B*S, O]), with the given documents.
Result attention_documents_run(bool round_bf16, int64_t B, int64_t S, std::vector<float> qkv, std::vector<float> dout,
                               const DocumentBoundaries& docs) {
  const AttentionShape s{B, S, kNq, kNkv, kD, docs};
  Result r{std::vector<float>(static_cast<size_t>(B * S * kO)), std::vector<float>(static_cast<size_t>(B * kNq * S)),
           std::vector<float>(qkv.size())};
  const OpContext ctx = cpu_ctx(round_bf16);
  const Tensor x = make_view(qkv.data(), {B * S, kW}, DType::F32), o = make_view(r.out.data(), {B * S, kO}, DType::F32);
  const Tensor l = make_view(r.lse.data(), {B, kNq, S}, DType::F32);
  attention_forward(ctx, o, l, x, s);
  attention_backward(ctx, make_view(r.dqkv.data(), {B * S, kW}, DType::F32),
                     make_view(dout.data(), {B * S, kO}, DType::F32), o, l, x, s);
  return r;
}

// Rows [a, e) of a row-major [*, width] buffer.
std::vector<float> rows(const std::vector<float>& v, int64_t a, int64_t e, int64_t width) {
  return std::vector<float>(v.begin() + a * width, v.begin() + e * width);
}

// The packed run's values of document [a, e) (of sample a / S) in the layout of that document run alone.
Result document_part(const Result& packed, int64_t a, int64_t e) {
  Result p{rows(packed.out, a, e, kO), {}, rows(packed.dqkv, a, e, kW)};
  const int64_t b = a / kS, len = e - a;
  for (int64_t h = 0; h < kNq; ++h)
    for (int64_t i = 0; i < len; ++i) p.lse.push_back(packed.lse[static_cast<size_t>((b * kNq + h) * kS + a % kS + i)]);
  return p;
}

void expect_matches(const std::vector<float>& got, const std::vector<float>& want, bool exact, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (exact) return expect_bits_equal(got, want, what);
  // The BF16 path: the P/dS roundings and GEMM sums over the zero-padded keys may differ in order: outputs
  // within a few BF16 ulps (relative 2^-7) of the document's own run.
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1.0 / 64 * std::max(1.0f, std::abs(want[i]))) << what << " at " << i;
}

void check_documents_alone(bool round_bf16) {
  std::mt19937 rng(2701);
  const HostF32 qkv = random_f32({kT, kW}, rng, -2.0f, 2.0f, round_bf16);
  const HostF32 dout = random_f32({kT, kO}, rng, -1.0f, 1.0f, round_bf16);
  const DocumentBoundaries docs{kOffsets.data(), nullptr, static_cast<int64_t>(kOffsets.size()) - 1};
  const Result packed = attention_documents_run(round_bf16, kB, kS, qkv.v, dout.v, docs);
  for (size_t k = 0; k + 1 < kOffsets.size(); ++k) {
    const int64_t a = kOffsets[k], e = kOffsets[k + 1];
    SCOPED_TRACE("document [" + std::to_string(a) + ", " + std::to_string(e) + ")");
    const Result alone = attention_documents_run(round_bf16, 1, e - a, rows(qkv.v, a, e, kW), rows(dout.v, a, e, kO), {});
    const Result part = document_part(packed, a, e);
    expect_matches(part.out, alone.out, !round_bf16, "out");
    expect_matches(part.lse, alone.lse, !round_bf16, "lse");
    expect_matches(part.dqkv, alone.dqkv, !round_bf16, "dqkv");
  }
  // Without the boundaries the later documents attend across them: different values.
  const Result causal = attention_documents_run(round_bf16, kB, kS, qkv.v, dout.v, {});
  EXPECT_NE(causal.out, packed.out);
  EXPECT_NE(causal.dqkv, packed.dqkv);
}

TEST(OpsAttentionDocuments, EachDocumentAsIfAloneFp32) { check_documents_alone(false); }

TEST(OpsAttentionDocuments, EachDocumentAsIfAloneBf16Gemms) {
  if (!cpu::cpu_gemm_engine().onednn_bf16) GTEST_SKIP() << "the BF16-GEMM attention path needs the oneDNN engine";
  check_documents_alone(true);
}

TEST(OpsAttentionDocuments, BrokenOffsetsNameTheOp) {
  std::vector<float> qkv(static_cast<size_t>(kT * kW)), out(static_cast<size_t>(kT * kO)), lse(kB * kNq * kS);
  const auto forward = [&](std::vector<int32_t> offsets) {
    const AttentionShape s{kB, kS, kNq, kNkv, kD,
                           DocumentBoundaries{offsets.data(), nullptr, static_cast<int64_t>(offsets.size()) - 1}};
    attention_forward(cpu_ctx(false), make_view(out.data(), {kT, kO}, DType::F32),
                      make_view(lse.data(), {kB, kNq, kS}, DType::F32), make_view(qkv.data(), {kT, kW}, DType::F32), s);
  };
  expect_error_naming("attention_forward", [&] { forward({0, 10, 80, 140}); });  // across the sample boundary
  expect_error_naming("attention_forward", [&] { forward({0, 10, 10, 70, 140}); });  // an empty document
  expect_error_naming("attention_forward", [&] { forward({0, 70, 139}); });  // short of T
}

}  // namespace
}  // namespace pl::optest
