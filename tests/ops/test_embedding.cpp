// Embedding gather and its deterministic scatter-add backward.
// On the CPU (Ops*) and, against the CPU backend, on the GPU (Cuda*, skipped without a device).
#include "op_test_util.h"

namespace pl::optest {
namespace {

constexpr int64_t kV = 11, kT = 50, kH = 150;  // kH is not a multiple of the 64-column block

TEST(OpsEmbedding, ForwardGathersRows) {
  std::mt19937 rng(201);
  HostF32 table = random_f32({kV, kH}, rng), out({kT, kH}, 7.0f);
  HostI32 tok = random_i32({kT}, rng, 0, kV);
  embedding_forward(cpu_ctx(false), out.t(), tok.t(), table.t());
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t c = 0; c < kH; ++c) ASSERT_EQ(out[t * kH + c], table[tok.v[t] * kH + c]) << t << "," << c;
}

TEST(OpsEmbedding, ForwardRoundBf16) {
  std::mt19937 rng(202);
  HostF32 table = random_f32({kV, kH}, rng), out({kT, kH});
  HostI32 tok = random_i32({kT}, rng, 0, kV);
  embedding_forward(cpu_ctx(true), out.t(), tok.t(), table.t());
  expect_bf16_representable(out.v, "out");
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t c = 0; c < kH; ++c)
      ASSERT_EQ(out[t * kH + c], num::round_bf16(table[tok.v[t] * kH + c])) << t << "," << c;
}

TEST(OpsEmbedding, BackwardAccumulatesScatter) {
  std::mt19937 rng(203);
  HostF32 dout = random_f32({kT, kH}, rng), prefill = random_f32({kV, kH}, rng, -2, 2);
  HostI32 tok = random_i32({kT}, rng, 0, kV);  // 50 tokens over 11 ids: many repeats
  HostF32 dtable = prefill;
  embedding_backward(cpu_ctx(true), dtable.t(), dout.t(), tok.t());  // round_bf16 must not round dtable
  std::vector<double> ref = prefill.d();
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t c = 0; c < kH; ++c) ref[tok.v[t] * kH + c] += dout[t * kH + c];
  expect_close(dtable.v, ref, 1e-6, "dtable");
}

TEST(OpsEmbedding, BackwardIndependentOfThreadCount) {
  std::mt19937 rng(204);
  const int64_t h = 300;
  HostF32 dout = random_f32({kT, h}, rng), prefill = random_f32({kV, h}, rng);
  HostI32 tok = random_i32({kT}, rng, 0, kV);
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
  HostF32 table({kV, kH}), out({4, kH}), out_bad({4, kH + 1});
  HostI32 tok({4}), bad_tok({4});
  bad_tok.v[2] = kV;
  const OpContext ctx = cpu_ctx(false);
  expect_error_naming("embedding_forward", [&] { embedding_forward(ctx, out.t(), bad_tok.t(), table.t()); });
  bad_tok.v[2] = -1;
  expect_error_naming("embedding_backward",
                      [&] { embedding_backward(ctx, table.t(), out.t(), bad_tok.t()); });
  expect_error_naming("embedding_forward", [&] { embedding_forward(ctx, out_bad.t(), tok.t(), table.t()); });
  expect_error_naming("embedding_backward",
                      [&] { embedding_backward(ctx, table.t(), out_bad.t(), tok.t()); });
}

// ---- CUDA: the same op on the GPU against the CPU backend (CudaEmbedding) -----------------------

// Exact (a copy).
TEST(CudaEmbedding, Forward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 77, h = 45, V = 103;
  std::vector<float> table = uniform_bf16(V * h, rng, -1.0f, 1.0f);
  std::vector<int32_t> tokens = uniform_ids(T, rng, V);
  tokens[3] = tokens[50] = static_cast<int32_t>(V - 1);  // repeats and the last row
  std::vector<float> out(T * h);
  std::vector<int32_t> tok_host = tokens;
  embedding_forward(cpu_ctx(true), host_view(out, {T, h}), Tensor(tok_host.data(), {T}, DType::I32), host_view(table, {V, h}));

  DeviceTensor d_out = device_tensor({T, h}, DType::BF16);
  DeviceTensor d_tok = to_device_i32(tokens, {T});
  DeviceTensor d_table = to_device(table, {V, h}, DType::BF16);
  embedding_forward(cuda_ctx(), d_out.t, d_tok.t, d_table.t);
  expect_bits_equal(to_host_floats(d_out.t), out, "embedding_forward out");

  // Ids are validated on the host (LlamaModel::upload_batch), not here: an out-of-range id is not an
  // error on the device, but it is never used as an address: its row comes out zero, the others exact.
  std::vector<int32_t> bad = tokens;
  bad[41] = static_cast<int32_t>(V);
  DeviceTensor d_bad = to_device_i32(bad, {T});
  embedding_forward(cuda_ctx(), d_out.t, d_bad.t, d_table.t);
  std::vector<float> expect = out;
  std::fill(expect.begin() + 41 * h, expect.begin() + 42 * h, 0.0f);
  expect_bits_equal(to_host_floats(d_out.t), expect, "embedding_forward out with an invalid id");
}

// Exact: every dtable element receives the CPU's fp32 additions in token order (stable sort of ids,
// one block per id walking its positions in order).
TEST(CudaEmbedding, Backward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 301, h = 333, V = 29;  // many repeats per id; h not a multiple of the block
  std::vector<int32_t> tokens = uniform_ids(T, rng, V);
  std::vector<float> dout = uniform_bf16(T * h, rng, -1.0f, 1.0f);
  std::vector<float> dtable = uniform_f32(V * h, rng, -0.5f, 0.5f);  // fp32 accumulator ("+=")
  std::vector<float> dtable_cpu = dtable;
  std::vector<int32_t> tok_host = tokens;
  embedding_backward(cpu_ctx(true), host_view(dtable_cpu, {V, h}), host_view(dout, {T, h}),
                     Tensor(tok_host.data(), {T}, DType::I32));

  DeviceTensor d_dtable = to_device(dtable, {V, h}, DType::F32);
  DeviceTensor d_dout = to_device(dout, {T, h}, DType::BF16);
  DeviceTensor d_tok = to_device_i32(tokens, {T});
  embedding_backward(cuda_ctx(), d_dtable.t, d_dout.t, d_tok.t);
  expect_bits_equal(to_host_floats(d_dtable.t), dtable_cpu, "embedding_backward dtable");

  // Run twice more: still the CPU's result for the accumulated value (determinism across calls).
  embedding_backward(cpu_ctx(true), host_view(dtable_cpu, {V, h}), host_view(dout, {T, h}),
                     Tensor(tok_host.data(), {T}, DType::I32));
  embedding_backward(cuda_ctx(), d_dtable.t, d_dout.t, d_tok.t);
  expect_bits_equal(to_host_floats(d_dtable.t), dtable_cpu, "embedding_backward dtable (second call)");

  // An invalid id (validated on the host in the model, not here) is skipped: its row adds nothing.
  std::vector<int32_t> bad = tokens;
  bad[7] = -3;
  DeviceTensor d_bad = to_device_i32(bad, {T});
  std::vector<float> dout_skip = dout;
  std::fill(dout_skip.begin() + 7 * h, dout_skip.begin() + 8 * h, 0.0f);  // token 7 contributes nothing
  std::vector<int32_t> tok_skip = tokens;  // any valid id: its contribution is zero
  embedding_backward(cpu_ctx(true), host_view(dtable_cpu, {V, h}), host_view(dout_skip, {T, h}),
                     Tensor(tok_skip.data(), {T}, DType::I32));
  embedding_backward(cuda_ctx(), d_dtable.t, d_dout.t, d_bad.t);
  expect_bits_equal(to_host_floats(d_dtable.t), dtable_cpu, "embedding_backward dtable with an invalid id");
}

}  // namespace
}  // namespace pl::optest
