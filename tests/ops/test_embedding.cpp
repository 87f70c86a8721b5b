// Embedding gather and its deterministic scatter-add backward.
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

}  // namespace
}  // namespace pl::optest
