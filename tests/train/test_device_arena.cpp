// The device arena's bookkeeping (core/tensor.h ArenaBlocks), on the host: freed space is reused, so a
// grow-only scratch that is reallocated larger does not leak arena space; neighbours coalesce; first
// fit; exhaustion is reported, not overrun. (The arena itself needs a GPU; this is its whole policy.)
#include <gtest/gtest.h>

#include "backend/device_memory.h"

namespace pl {
namespace {

TEST(DeviceArena, GrowingScratchReusesItsOldSpaceInsteadOfLeakingIt) {
  ArenaBlocks a(1 << 20);
  const size_t fixed = a.take(1000);  // e.g. the activations, allocated once
  EXPECT_EQ(fixed, 0u);
  // A DeviceScratch growing 10 times (free the old buffer, then allocate the larger one).
  size_t scratch = a.take(256), bytes = 256;
  for (int i = 0; i < 10; ++i) {
    a.give(scratch, bytes);
    bytes += 512;
    scratch = a.take(bytes);
    ASSERT_NE(scratch, ArenaBlocks::kNone);
    EXPECT_EQ(scratch, 1024u) << "the scratch sits right above the fixed block every time";
  }
  EXPECT_EQ(a.top(), 1024u + bytes) << "only the final scratch size is in use (a bump allocator would hold all 11)";
  EXPECT_EQ(a.free_block_count(), 0u);
  EXPECT_EQ(a.peak(), 1024u + bytes);
}

TEST(DeviceArena, FreedNeighboursCoalesceAndFirstFitTakesTheLowestBlock) {
  ArenaBlocks a(10 * 256);
  const size_t b0 = a.take(256), b1 = a.take(300), b2 = a.take(256), b3 = a.take(256);
  EXPECT_EQ(b1, 256u);
  EXPECT_EQ(b2, 768u) << "300 bytes round up to 512";
  a.give(b1, 300);
  a.give(b0, 256);
  EXPECT_EQ(a.free_block_count(), 1u) << "blocks 0 and 1 are one free block of 768 bytes";
  EXPECT_EQ(a.take(768), 0u) << "the coalesced block fits exactly";
  a.give(0, 768);
  EXPECT_EQ(a.take(100), 0u) << "first fit: the lowest free block";
  EXPECT_EQ(a.take(100), 256u) << "the rest of the split block";
  // Freeing the top block lowers the top; the free block below it joins when it is freed too.
  a.give(b3, 256);
  EXPECT_EQ(a.top(), 1024u);
  EXPECT_EQ(a.free_block_count(), 1u) << "[512, 768) is free below the top";
  a.give(b2, 256);
  EXPECT_EQ(a.top(), 512u) << "[768, 1024) merged with the free [512, 768) below it, at the top";
  EXPECT_EQ(a.free_block_count(), 0u);
  a.give(256, 100);
  EXPECT_EQ(a.top(), 256u);
  EXPECT_EQ(a.peak(), 1280u) << "the peak stays";
}

TEST(DeviceArena, ExhaustionIsReportedNotOverrun) {
  ArenaBlocks a(1024);
  EXPECT_EQ(a.take(1024), 0u);
  EXPECT_EQ(a.take(1), ArenaBlocks::kNone);
  a.give(0, 1024);
  EXPECT_EQ(a.take(1025), ArenaBlocks::kNone);
  EXPECT_EQ(a.take(768), 0u);
  EXPECT_EQ(a.take(512), ArenaBlocks::kNone) << "256 bytes left";
}

TEST(DeviceArena, MarginIsTwoGibOrThreePercent) {
  EXPECT_EQ(device_memory_margin(40e9), 2.0 * 1024 * 1024 * 1024) << "the floor on a small device";
  EXPECT_DOUBLE_EQ(device_memory_margin(80e9), 0.03 * 80e9) << "H100 80 GB: 2.4 GB";
  EXPECT_DOUBLE_EQ(device_memory_margin(141e9), 0.03 * 141e9) << "H200: 4.2 GB";
}

}  // namespace
}  // namespace pl
