// The cuBLASLt 128x4 swizzled block-scale layout (lib/numerics/swizzle.h, SPEC-NVFP4 §6.2): the
// spec's listed offsets, the padding helpers, agreement with the [R'/128, 4, 32, C'/4, 4] ->
// (0, 3, 2, 1, 4) permutation, and that it is a bijection onto [0, R'*C').
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "numerics/swizzle.h"

namespace pl {
namespace {

TEST(NumericsSwizzle, SpecOffsets) {
  EXPECT_EQ(num::swizzled_scale_offset(0, 0, 4), 0);
  EXPECT_EQ(num::swizzled_scale_offset(0, 1, 4), 1);
  EXPECT_EQ(num::swizzled_scale_offset(1, 0, 4), 16);
  EXPECT_EQ(num::swizzled_scale_offset(32, 0, 4), 4);
  EXPECT_EQ(num::swizzled_scale_offset(127, 3, 4), 511);
  EXPECT_EQ(num::swizzled_scale_offset(0, 4, 8), 512);
  EXPECT_EQ(num::swizzled_scale_offset(128, 0, 8), 1024);
}

TEST(NumericsSwizzle, Padding) {
  EXPECT_EQ(num::padded_scale_rows(1), 128);
  EXPECT_EQ(num::padded_scale_rows(128), 128);
  EXPECT_EQ(num::padded_scale_rows(129), 256);
  EXPECT_EQ(num::padded_scale_rows(0), 0);
  EXPECT_EQ(num::padded_scale_cols(1), 4);
  EXPECT_EQ(num::padded_scale_cols(4), 4);
  EXPECT_EQ(num::padded_scale_cols(5), 8);
  EXPECT_EQ(num::padded_scale_cols(0), 0);
}

TEST(NumericsSwizzle, PermutationAndBijection) {
  for (const auto& shape : {std::pair<int64_t, int64_t>{200, 5}, {128, 4}, {1, 1}, {384, 12}, {257, 33}}) {
    const int64_t R = num::padded_scale_rows(shape.first), C = num::padded_scale_cols(shape.second);
    std::vector<int> hits(static_cast<size_t>(R * C), 0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t off = num::swizzled_scale_offset(r, c, C);
        ASSERT_GE(off, 0);
        ASSERT_LT(off, R * C);
        ++hits[static_cast<size_t>(off)];
        // Index of (r/128, (r%128)/32, r%32, c/4, c%4) after permuting to (0, 3, 2, 1, 4), row-major
        // in the permuted shape [R/128, C/4, 32, 4, 4].
        const int64_t i0 = r / 128, i1 = (r % 128) / 32, i2 = r % 32, i3 = c / 4, i4 = c % 4;
        const int64_t perm = (((i0 * (C / 4) + i3) * 32 + i2) * 4 + i1) * 4 + i4;
        ASSERT_EQ(off, perm) << r << "," << c;
      }
    for (int h : hits) ASSERT_EQ(h, 1);
  }
}

}  // namespace
}  // namespace pl
