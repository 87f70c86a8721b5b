// The fixed-order FP32 sums of lib/numerics/reduce.h: the tree's exact order of additions, the lane
// assignment, the group levels, and the accuracy against double. The CUDA side (block_tree_sum) is
// checked through the ops that use it (rmsnorm, cross_entropy, optimizer): the Cuda/ cases of
// tests/ops/test_<op>.cpp compare them with the CPU (bit-exact where the op is).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "numerics/bf16.h"
#include "numerics/reduce.h"

namespace pl {
namespace {

TEST(NumericsReduce, TreeSumOrderIsTheDocumentedOne) {
  // n = 5: P = 8; s = 4: a0 += a4; s = 2: a0 += a2, a1 += a3; s = 1: a0 += a1.
  // Values chosen so that every other order gives a different float.
  const float a[5] = {1.0f, 0x1p-24f, -1.0f, 0x1p-24f, 0x1p-25f};
  float b[5];
  std::copy(a, a + 5, b);
  const float got = num::tree_sum(b, 5);
  const float want = ((a[0] + a[4]) + a[2]) + (a[1] + a[3]);
  EXPECT_EQ(num::float_bits(got), num::float_bits(want));
  // The sequential order would give another value here (1 + 2^-25 rounds to 1).
  EXPECT_NE(got, (((a[0] + a[1]) + a[2]) + a[3]) + a[4]);
  // Strided, and n = 1 (the value itself), n = 2, n = 3.
  float s[12] = {3.0f, 0, 0, 5.0f, 0, 0, 7.0f, 0, 0, 11.0f, 0, 0};
  EXPECT_EQ(num::tree_sum(s, 4, 3), (3.0f + 7.0f) + (5.0f + 11.0f));
  float one[1] = {-0.0f};
  EXPECT_EQ(num::float_bits(num::tree_sum(one, 1)), 0x80000000u);
  float three[3] = {1e8f, 1.0f, -1e8f};
  EXPECT_EQ(num::tree_sum(three, 3), (1e8f + -1e8f) + 1.0f);
}

TEST(NumericsReduce, LaneSumAssignsTermsToLanesInOrder) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t n : {int64_t{1}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{1000}, int64_t{4096}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = nd(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
    int calls = 0;
    const float got = num::lane_sum<64>(n, [&](int64_t i) {
      EXPECT_EQ(i, calls) << "terms are requested once each, in order";
      ++calls;
      return x[static_cast<size_t>(i)];
    });
    EXPECT_EQ(calls, n);
    float lane[64] = {};
    for (int64_t i = 0; i < n; ++i) lane[i % 64] = lane[i % 64] + x[static_cast<size_t>(i)];
    for (int s = 32; s >= 1; s /= 2)
      for (int k = 0; k < s; ++k) lane[k] = lane[k] + lane[k + s];
    EXPECT_EQ(num::float_bits(got), num::float_bits(lane[0])) << "n = " << n;
    double ref = 0.0, abs_sum = 0.0;
    for (float v : x) {
      ref += v;
      abs_sum += std::abs(v);
    }
    EXPECT_NEAR(got, ref, (static_cast<double>(n) / 64 + 8) * 0x1p-24 * abs_sum) << "n = " << n;
  }
}

TEST(NumericsReduce, GroupTreeSumLevels) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{256}, int64_t{257}, int64_t{70000}}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    // Written out: levels of groups of 256 (padded with +0), each by the 256-slot tree.
    std::vector<float> level = v;
    while (level.size() > 1) {
      std::vector<float> next;
      for (size_t g = 0; g < level.size(); g += 256) {
        float slot[256] = {};
        for (size_t k = 0; k < 256 && g + k < level.size(); ++k) slot[k] = level[g + k];
        for (int s = 128; s >= 1; s /= 2)
          for (int k = 0; k < s; ++k) slot[k] = slot[k] + slot[k + s];
        next.push_back(slot[0]);
      }
      level = next;
    }
    std::vector<float> w = v;
    EXPECT_EQ(num::float_bits(num::group_tree_sum(w.data(), n)), num::float_bits(level[0])) << "n = " << n;
    double ref = 0.0;
    for (float x : v) ref += x;
    EXPECT_NEAR(level[0], ref, 30 * 0x1p-24 * ref) << "n = " << n;
  }
}

}  // namespace
}  // namespace pl
