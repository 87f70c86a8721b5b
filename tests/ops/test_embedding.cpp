// Embedding gather and its deterministic scatter-add backward.
// Cpu/Embedding.* and Cuda/Embedding.* run the same cases on each backend (the GPU also against the
// CPU backend, bit for bit); OpsEmbedding.* are CPU-only (plain FP32, thread counts, errors).
#include "op_test_util.h"

namespace pl::optest {
namespace {

constexpr int64_t kEmbeddingV = 11, kEmbeddingT = 50, kH = 150;  // kH is not a multiple of the 64-column block

TEST(OpsEmbedding, ForwardGathersRows) {
  std::mt19937 rng(201);
  HostF32 table = random_f32({kEmbeddingV, kH}, rng), out({kEmbeddingT, kH}, 7.0f);
  HostI32 tok = random_i32({kEmbeddingT}, rng, 0, kEmbeddingV);
  embedding_forward(cpu_ctx(false), out.t(), tok.t(), table.t());
  for (int64_t t = 0; t < kEmbeddingT; ++t)
    for (int64_t c = 0; c < kH; ++c) ASSERT_EQ(out[t * kH + c], table[tok.v[t] * kH + c]) << t << "," << c;
}

TEST(OpsEmbedding, BackwardIndependentOfThreadCount) {
  std::mt19937 rng(204);
  const int64_t h = 300;
  HostF32 dout = random_f32({kEmbeddingT, h}, rng), prefill = random_f32({kEmbeddingV, h}, rng);
  HostI32 tok = random_i32({kEmbeddingT}, rng, 0, kEmbeddingV);
  HostF32 a = prefill, b = prefill;
  {
    ScopedThreads one(1);
    embedding_backward(cpu_ctx(false), a.t(), dout.t(), tok.t());
  }
  {
    ScopedThreads two(2);
    embedding_backward(cpu_ctx(false), b.t(), dout.t(), tok.t());
  }
  EXPECT_TRUE(bitwise_equal(a.v, b.v));
}

TEST(OpsEmbedding, ErrorsNameTheOp) {
  HostF32 table({kEmbeddingV, kH}), out({4, kH}), out_bad({4, kH + 1});
  HostI32 tok({4}), bad_tok({4});
  bad_tok.v[2] = kEmbeddingV;
  const OpContext ctx = cpu_ctx(false);
  expect_error_naming("embedding_forward", [&] { embedding_forward(ctx, out.t(), bad_tok.t(), table.t()); });
  bad_tok.v[2] = -1;
  expect_error_naming("embedding_backward",
                      [&] { embedding_backward(ctx, table.t(), out.t(), bad_tok.t()); });
  expect_error_naming("embedding_forward", [&] { embedding_forward(ctx, out_bad.t(), tok.t(), table.t()); });
  expect_error_naming("embedding_backward",
                      [&] { embedding_backward(ctx, table.t(), out_bad.t(), tok.t()); });
}

// ---- on every backend (Cpu/ and Cuda/Embedding.*) -------------------------------------------------

class Embedding : public OnBackend {};
PL_INSTANTIATE_BACKENDS(Embedding);

struct Shape {
  int64_t T, h, V;
};
// kH: not a multiple of the 64-column block; then fresh odd shapes, h not a multiple of a GPU block.
const Shape kFwdShapes[] = {{kEmbeddingT, kH, kEmbeddingV}, {77, 45, 103}}, kBwdShapes[] = {{kEmbeddingT, kH, kEmbeddingV}, {301, 333, 29}};

// out = round_bf16(table[tok]): a copy, exact on every backend (the GPU's BF16 table holds the
// rounded values). Repeated ids and the last row.
TEST_P(Embedding, ForwardGathersRoundedRows) {
  PL_SEEDED_RNG(rng);
  for (const auto& [T, h, V] : kFwdShapes) {
    std::vector<float> table = uniform_f32(V * h, rng, -1.0f, 1.0f);
    std::vector<int32_t> tok = uniform_ids(T, rng, V);
    tok[3] = tok[T - 1] = static_cast<int32_t>(V - 1);
    const auto forward = [&](Backend& b, std::vector<int32_t>& ids) {
      std::vector<float> out(T * h, 7.0f);
      embedding_forward(b.ctx(), b.put(out, {T, h}, DType::BF16), b.put(ids, {T}), b.put(table, {V, h}, DType::BF16));
      return b.get(out);
    };
    const std::vector<float> out =
        run_exact(GetParam(), [&](Backend& b) { return forward(b, tok); }, "embedding_forward out");
    expect_bf16_representable(out, "out");
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < h; ++c)
        ASSERT_EQ(out[t * h + c], num::round_bf16(table[tok[t] * h + c])) << t << "," << c;
    if (!on_cuda()) continue;
    // Ids are validated on the host (LlamaModel::upload_batch), not here: an out-of-range id is not an
    // error on the device, but it is never used as an address: its row comes out zero, the others exact.
    std::vector<int32_t> bad = tok;
    bad[41] = static_cast<int32_t>(V);
    Backend gpu(Device::CUDA);
    std::vector<float> expect = out;
    std::fill(expect.begin() + 41 * h, expect.begin() + 42 * h, 0.0f);
    expect_bits_equal(forward(gpu, bad), expect, "embedding_forward out with an invalid id");
  }
}

// dtable += scatter of dout by tokens, over two calls: fp32, never rounded (round_bf16 is on),
// against double. Exact between backends: every dtable element gets the CPU's fp32 additions in token
// order (stable sort of ids, one block per id walking its positions in order).
TEST_P(Embedding, BackwardAccumulatesScatter) {
  PL_SEEDED_RNG(rng);
  for (const auto& [T, h, V] : kBwdShapes) {
    std::vector<float> dout = uniform_bf16(T * h, rng, -1.0f, 1.0f), prefill = uniform_f32(V * h, rng, -2.0f, 2.0f);
    std::vector<int32_t> tok = uniform_ids(T, rng, V);
    const auto backward = [&](Backend& b, std::vector<float>& g, std::vector<int32_t>& ids, int calls) {
      std::vector<float> dtable = prefill, all;
      const Tensor dt = b.put(dtable, {V, h}, DType::F32), dg = b.put(g, {T, h}, DType::BF16), ti = b.put(ids, {T});
      for (int i = 0; i < calls; ++i) {
        embedding_backward(b.ctx(), dt, dg, ti);
        all = joined({all, b.get(dtable)});
      }
      return all;
    };
    const std::vector<float> got =
        run_exact(GetParam(), [&](Backend& b) { return backward(b, dout, tok, 2); }, "embedding_backward dtable");
    std::vector<double> ref(prefill.begin(), prefill.end());
    for (int call = 0; call < 2; ++call) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < h; ++c) ref[tok[t] * h + c] += dout[t * h + c];
      expect_close(std::vector<float>(got.begin() + call * V * h, got.begin() + (call + 1) * V * h), ref, 1e-6,
                   "dtable after call " + std::to_string(call + 1));
    }
    if (!on_cuda()) continue;
    // An invalid id (validated on the host in the model, not here) is skipped: its row adds nothing.
    std::vector<int32_t> bad = tok;
    bad[7] = -3;
    std::vector<float> dout_skip = dout;
    std::fill(dout_skip.begin() + 7 * h, dout_skip.begin() + 8 * h, 0.0f);  // token 7 contributes nothing
    Backend gpu(Device::CUDA), cpu(Device::CPU);
    expect_bits_equal(backward(gpu, dout, bad, 1), backward(cpu, dout_skip, tok, 1),
                      "embedding_backward dtable with an invalid id");
  }
}

}  // namespace
}  // namespace pl::optest
