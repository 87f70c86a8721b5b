// The packed attention layout's copies (backend/cuda/attention_pack.cu) on the GPU, exactly: the pack
// of qkv rows [T, (nq + 2 nkv) d] into contiguous Q [T, nq, d], K [T, nkv, d], V [T, nkv, d], and the
// unpack of dQ, dK, dV back into rows, against the index map written out on the host (bit-exact: pure
// data movement). Odd token counts and each head dim the models use (32, 64, 128), so every 16-byte
// vector lands in the right head. The attention results in both layouts are compared with the CPU in
// tests/ops/test_attention.cpp (CudaAttention*). Compiled always; skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/attention_pack.h"
#endif

namespace pl {
namespace {

TEST(CudaAttentionLayouts, PackAndUnpackMoveEveryElementToItsPlace) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  struct Shape {
    int64_t T, nq, nkv, d;
  };
  for (const Shape& s : {Shape{7, 8, 2, 32}, Shape{129, 4, 2, 64}, Shape{33, 32, 8, 128}, Shape{5, 2, 2, 8}}) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " nq=" + std::to_string(s.nq) + " nkv=" + std::to_string(s.nkv) +
                 " d=" + std::to_string(s.d));
    const int64_t W = (s.nq + 2 * s.nkv) * s.d, n = s.T * W;
    // Values exact in BF16 and different between neighbours: integers below 256 with a sign and a
    // power-of-two scale that changes every 251 elements.
    std::vector<float> rows(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      rows[i] = static_cast<float>(i % 251) * (i % 2 ? -1.0f : 1.0f) * static_cast<float>(1 << (i / 251 % 4));
    // The packed layout written out: element (t, c) of the rows goes to Q, K or V of token t.
    std::vector<float> packed(rows.size());
    const int64_t qd = s.nq * s.d, kvd = s.nkv * s.d;
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t c = 0; c < W; ++c) {
        const int64_t at = c < qd ? t * qd + c
                           : c < qd + kvd ? s.T * qd + t * kvd + (c - qd)
                                          : s.T * (qd + kvd) + t * kvd + (c - qd - kvd);
        packed[at] = rows[t * W + c];
      }
    auto d_rows = test::to_device(rows, {s.T, W}, DType::BF16);
    auto d_packed = test::to_device(std::vector<float>(rows.size(), NAN), {s.T, W}, DType::BF16);
    cuda::attention_pack_qkv(*test::cuda_ctx().gpu, d_rows.t.data, d_packed.t.data, s.T, s.nq, s.nkv, s.d);
    EXPECT_EQ(test::to_host_floats(d_packed.t), packed) << "pack";
    auto d_back = test::to_device(std::vector<float>(rows.size(), NAN), {s.T, W}, DType::BF16);
    cuda::attention_unpack_dqkv(*test::cuda_ctx().gpu, d_packed.t.data, d_back.t.data, s.T, s.nq, s.nkv, s.d);
    EXPECT_EQ(test::to_host_floats(d_back.t), rows) << "unpack";
  }
#endif
}

}  // namespace
}  // namespace pl
