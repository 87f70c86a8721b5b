// Philox4x32-10 (lib/numerics/philox.h) against Random123's published known-answer vectors
// (DEShawResearch/random123 tests/kat_vectors @9545ff64, the three "philox4x32 10" lines), and the
// stochastic-rounding byte stream built on it: layout, stream separation, rough uniformity.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "numerics/philox.h"

namespace pl {
namespace {

TEST(NumericsPhilox, Random123KnownAnswerVectors) {
  const struct {
    uint32_t ctr[4];
    uint32_t key[2];
    uint32_t want[4];
  } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kat) {
    uint32_t out[4];
    num::philox4x32_10(k.ctr, k.key, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], k.want[i]) << std::hex << "word " << i << " got 0x" << out[i];
  }
}

TEST(NumericsPhilox, SrBytesLayout) {
  const uint64_t seed = 0x0123456789ABCDEFull;
  for (uint64_t block : {0ull, 1ull, 77ull, (1ull << 32) + 5}) {
    uint8_t b16[16];
    num::sr_random_bytes16(seed, 9, 1234, block, b16);
    // The documented mapping: key = seed, counter = {b, b>>32 ^ counter>>32, stream, counter}.
    const uint32_t ctr[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 9u, 1234u};
    const uint32_t key[2] = {0x89ABCDEFu, 0x01234567u};
    uint32_t r[4];
    num::philox4x32_10(ctr, key, r);
    for (int k = 0; k < 16; ++k) {
      EXPECT_EQ(b16[k], static_cast<uint8_t>(r[k / 4] >> (8 * (k % 4))));
      EXPECT_EQ(num::sr_random_byte(seed, 9, 1234, block * 16 + static_cast<uint64_t>(k)), b16[k]);
    }
  }
  // The high half of `counter` is folded into counter word 1.
  uint8_t a[16], b[16];
  num::sr_random_bytes16(seed, 0, 0, 0, a);
  num::sr_random_bytes16(seed, 0, 1ull << 32, 0, b);
  const uint32_t ctr[4] = {0u, 1u, 0u, 0u};
  const uint32_t key[2] = {0x89ABCDEFu, 0x01234567u};
  uint32_t r[4];
  num::philox4x32_10(ctr, key, r);
  EXPECT_EQ(b[0], static_cast<uint8_t>(r[0]));
  EXPECT_NE(std::vector<uint8_t>(a, a + 16), std::vector<uint8_t>(b, b + 16));
}

TEST(NumericsPhilox, StreamsDifferAndBytesLookUniform) {
  // Different seed / stream / counter / block give different 128-bit blocks.
  std::set<std::vector<uint8_t>> seen;
  for (uint64_t seed : {0ull, 1ull, 1ull << 40})
    for (uint32_t stream : {0u, 1u, 2u})
      for (uint64_t counter : {0ull, 1ull, 1ull << 33})
        for (uint64_t block : {0ull, 1ull, 1ull << 32}) {
          uint8_t b[16];
          num::sr_random_bytes16(seed, stream, counter, block, b);
          seen.insert(std::vector<uint8_t>(b, b + 16));
        }
  EXPECT_EQ(seen.size(), 81u);
  // Chi-square of 2^20 bytes over 256 bins (255 dof: mean 255, sd ~22.6; allow 6 sd).
  std::vector<int64_t> hist(256, 0);
  const int64_t n = 1 << 20;
  for (int64_t blk = 0; blk < n / 16; ++blk) {
    uint8_t b[16];
    num::sr_random_bytes16(42, 5, 17, static_cast<uint64_t>(blk), b);
    for (uint8_t v : b) ++hist[v];
  }
  double chi2 = 0;
  const double expect = static_cast<double>(n) / 256;
  for (int64_t h : hist) chi2 += (h - expect) * (h - expect) / expect;
  EXPECT_LT(chi2, 255 + 6 * 22.6);
  EXPECT_GT(chi2, 255 - 6 * 22.6);
}

}  // namespace
}  // namespace pl
