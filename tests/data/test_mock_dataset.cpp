// Megatron GPTDataset index building and MockGPTDataset (SPEC-MEGATRON §4, §5).
// Golden values: tokens per epoch 68,190,290 and the sample counts 16,648 / 8,324 come from the
// spec; everything else was printed by scripts/mock_data_golden.py (a Python + numpy reference of
// Megatron's split rules, _build_document_index, helpers.cpp build_sample_idx, _build_shuffle_index
// and __getitem__) running numpy 2.4.6. Its build_sample_idx was checked equal to Megatron's own
// compiled helpers.cpp (commit d7288711) on all the cases below.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <numeric>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/mock_dataset.h"
#include "data/numpy_rng.h"

#include "test_util.h"

namespace {

using pl::test::fnv1a;  // the same fingerprint as scripts/mock_data_golden.py

using namespace pl::data;

template <class T>
std::vector<T> slice(const std::vector<T>& v, size_t begin, size_t n) {
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(begin),
                        v.begin() + static_cast<std::ptrdiff_t>(begin + n));
}

// One sample: dataset index, shuffle_index[idx], sample_index rows j and j+1, sum and FNV of the
// seq+1 tokens, first and last six tokens.
struct SampleGolden {
  int64_t idx, shuffle, beg, beg_off, end, end_off, sum;
  uint64_t fnv;
  std::vector<int32_t> first, last;
};

void check_samples(const GPTDataset& ds, const std::vector<SampleGolden>& goldens) {
  std::vector<int32_t> text(static_cast<size_t>(ds.sample_length()));
  for (const auto& g : goldens) {
    SCOPED_TRACE(testing::Message() << "sample " << g.idx);
    const auto j = static_cast<size_t>(ds.shuffle_index()[static_cast<size_t>(g.idx)]);
    EXPECT_EQ(static_cast<int64_t>(j), g.shuffle);
    EXPECT_EQ(ds.sample_index()[2 * j], g.beg);
    EXPECT_EQ(ds.sample_index()[2 * j + 1], g.beg_off);
    EXPECT_EQ(ds.sample_index()[2 * j + 2], g.end);
    EXPECT_EQ(ds.sample_index()[2 * j + 3], g.end_off);
    ds.get(g.idx, text);
    EXPECT_EQ(std::accumulate(text.begin(), text.end(), int64_t{0}), g.sum);
    EXPECT_EQ(fnv1a(text), g.fnv);
    EXPECT_EQ(slice(text, 0, 6), g.first);
    EXPECT_EQ(slice(text, text.size() - 6, 6), g.last);
  }
}

std::vector<int64_t> row(const GPTDataset& ds, size_t r) {
  return {ds.sample_index()[2 * r], ds.sample_index()[2 * r + 1]};
}

// ---- split strings ----------------------------------------------------------------------------------
using Range = std::optional<std::pair<int64_t, int64_t>>;
using Ranges = std::array<Range, 3>;

TEST(DataSplit, MegatronBookEnds) {
  EXPECT_EQ(split_ranges("1,1,1", 100000), (Ranges{std::pair<int64_t, int64_t>{0, 33333}, std::pair<int64_t, int64_t>{33333, 66667},
                                                   std::pair<int64_t, int64_t>{66667, 100000}}));
  EXPECT_EQ(split_ranges("9999,8,2", 100000), (Ranges{std::pair<int64_t, int64_t>{0, 99900}, std::pair<int64_t, int64_t>{99900, 99980},
                                                      std::pair<int64_t, int64_t>{99980, 100000}}));
  EXPECT_EQ(split_ranges("99,1,0", 1000), (Ranges{std::pair<int64_t, int64_t>{0, 990}, std::pair<int64_t, int64_t>{990, 1000}, std::nullopt}));
  EXPECT_EQ(split_ranges("6,3,1", 50), (Ranges{std::pair<int64_t, int64_t>{0, 30}, std::pair<int64_t, int64_t>{30, 45},
                                               std::pair<int64_t, int64_t>{45, 50}}));
  EXPECT_EQ(split_ranges("0.7, 0.2 ,0.1", 33), (Ranges{std::pair<int64_t, int64_t>{0, 23}, std::pair<int64_t, int64_t>{23, 30},
                                                       std::pair<int64_t, int64_t>{30, 33}}));
  EXPECT_EQ(split_ranges("1,2", 7), (Ranges{std::pair<int64_t, int64_t>{0, 2}, std::pair<int64_t, int64_t>{2, 7}, std::nullopt}));
}

TEST(DataSplit, RejectsBadStrings) {
  EXPECT_THROW(split_ranges("", 10), pl::Error);
  EXPECT_THROW(split_ranges("1,1,1,1", 10), pl::Error);
  EXPECT_THROW(split_ranges("0,0,0", 10), pl::Error);
  EXPECT_THROW(split_ranges("1..2,1", 10), pl::Error);
}

// ---- the mock low-level dataset ---------------------------------------------------------------------
TEST(DataMockDataset, LowLevelDocuments) {
  const MockGPTLowLevelDataset low(32000, 31999);
  ASSERT_EQ(low.num_sequences(), 100000);
  ASSERT_EQ(low.sequence_lengths()[0], 3484);
  std::vector<int32_t> doc(3484);
  low.get(0, 0, 3484, doc.data());
  for (int k = 0; k < 3483; ++k) ASSERT_EQ(doc[static_cast<size_t>(k)], k + 1);
  EXPECT_EQ(doc.back(), 31999);
  // Length-68 document 7, read from offset 60.
  ASSERT_EQ(low.sequence_lengths()[7], 68);
  std::vector<int32_t> tail(8);
  low.get(7, 60, 8, tail.data());
  EXPECT_EQ(tail, (std::vector<int32_t>{61, 62, 63, 64, 65, 66, 67, 31999}));
  EXPECT_THROW(low.get(7, 60, 9, tail.data()), pl::Error);
  EXPECT_THROW(low.get(100000, 0, 1, tail.data()), pl::Error);

  // Small vocabulary: tokens are k % V, so the EOD id also occurs inside documents.
  const MockGPTLowLevelDataset small(512, 511);
  small.get(0, 0, 3484, doc.data());
  EXPECT_EQ(doc[510], 511);  // token 511 at offset 510, mid-document
  EXPECT_EQ(doc[511], 0);
  EXPECT_EQ(doc[512], 1);
  EXPECT_EQ(doc[3482], 3483 % 512);
  EXPECT_EQ(doc[3483], 511);
}

TEST(DataMockDataset, TrainSplitEpochAndSampleCounts) {
  for (const auto& [seq, ns, expect] : {std::tuple<int64_t, int64_t, int64_t>{4096, 3200, 16648}, {8192, 1600, 8324}}) {
    const MockGPTDataset ds({32000, 31999, seq, ns});
    EXPECT_EQ(ds.gpt().tokens_per_epoch(), 68190290);
    EXPECT_EQ(ds.gpt().num_epochs(), 1);
    EXPECT_FALSE(ds.gpt().separate_final_epoch());
    EXPECT_EQ(ds.size(), expect) << "seq " << seq;
    EXPECT_EQ(static_cast<int64_t>(ds.gpt().document_index().size()), 33333);
  }
}

TEST(DataMockDataset, Seq4096Playbook) {
  const MockGPTDataset mock({32000, 31999, 4096, 3200});
  const GPTDataset& ds = mock.gpt();
  EXPECT_EQ(slice(ds.document_index(), 0, 10),
            (std::vector<int32_t>{30903, 11571, 3134, 32473, 27454, 4409, 3622, 19425, 2854, 4679}));
  EXPECT_EQ(fnv1a(ds.document_index()), 0x203735d13adf3e25ULL);
  EXPECT_EQ(row(ds, 1), (std::vector<int64_t>{1, 1095}));
  EXPECT_EQ(row(ds, 2), (std::vector<int64_t>{4, 198}));
  EXPECT_EQ(row(ds, 3), (std::vector<int64_t>{5, 839}));
  EXPECT_EQ(row(ds, 4), (std::vector<int64_t>{8, 1301}));
  EXPECT_EQ(row(ds, 16648), (std::vector<int64_t>{33332, 3421}));
  EXPECT_EQ(fnv1a(ds.sample_index()), 0xda6f9b146d27b89aULL);
  EXPECT_EQ(slice(ds.shuffle_index(), 0, 10),
            (std::vector<int64_t>{2298, 5404, 9985, 15861, 4049, 12744, 3177, 14934, 8849, 2784}));
  EXPECT_EQ(fnv1a(ds.shuffle_index()), 0xc9dbffbb331fc27fULL);
  check_samples(ds, {
      {0, 2298, 4637, 610, 4639, 763, 4075306, 0x2c63b91c7c2b533dULL, {611, 612, 613, 614, 615, 616}, {759, 760, 761, 762, 763, 764}},
      {1, 5404, 10815, 3436, 10819, 918, 3865908, 0xf5a46ac07e4cb473ULL, {3437, 3438, 3439, 3440, 3441, 3442}, {914, 915, 916, 917, 918, 919}},
      {2, 9985, 20022, 1725, 20023, 3627, 7532051, 0x550522e3f06b0ed2ULL, {1726, 1727, 1728, 1729, 1730, 1731}, {3623, 3624, 3625, 3626, 3627, 3628}},
      {3, 15861, 31755, 249, 31759, 267, 2560529, 0x4049853675d7a902ULL, {250, 251, 252, 253, 254, 255}, {263, 264, 265, 266, 267, 268}},
      {63, 10894, 21840, 1568, 21842, 311, 6584666, 0x27719506af8206f5ULL, {1569, 1570, 1571, 1572, 1573, 1574}, {307, 308, 309, 310, 311, 312}},
      {64, 3545, 7110, 2397, 7112, 1618, 5843394, 0x06c4313d89ef6259ULL, {2398, 2399, 2400, 2401, 2402, 2403}, {1614, 1615, 1616, 1617, 1618, 1619}},
      {1000, 902, 1843, 676, 1844, 2133, 5562059, 0xefd47ea40d496ab8ULL, {677, 678, 679, 680, 681, 682}, {2129, 2130, 2131, 2132, 2133, 2134}},
      {3199, 11006, 22079, 1025, 22082, 351, 4744492, 0x3969622eaa2a30c7ULL, {1026, 1027, 1028, 1029, 1030, 1031}, {347, 348, 349, 350, 351, 352}},
      {16647, 10469, 20995, 3282, 20998, 363, 4078377, 0xd73c7bdb9c9973aeULL, {3283, 3284, 3285, 3286, 3287, 3288}, {359, 360, 361, 362, 363, 364}},
  });
}

TEST(DataMockDataset, Seq8192) {
  const MockGPTDataset mock({32000, 31999, 8192, 1600});
  const GPTDataset& ds = mock.gpt();
  EXPECT_EQ(fnv1a(ds.document_index()), 0x203735d13adf3e25ULL);
  EXPECT_EQ(row(ds, 1), (std::vector<int64_t>{4, 198}));
  EXPECT_EQ(row(ds, 4), (std::vector<int64_t>{16, 2126}));
  EXPECT_EQ(row(ds, 8324), (std::vector<int64_t>{33332, 3421}));
  EXPECT_EQ(fnv1a(ds.sample_index()), 0xed68e83a7eee31d8ULL);
  EXPECT_EQ(slice(ds.shuffle_index(), 0, 10),
            (std::vector<int64_t>{201, 1675, 268, 4657, 2328, 7284, 709, 7552, 5575, 6185}));
  EXPECT_EQ(fnv1a(ds.shuffle_index()), 0x57a7bb65a9479aabULL);
  check_samples(ds, {
      {0, 201, 823, 965, 828, 630, 10987239, 0x538f50a194819ab0ULL, {966, 967, 968, 969, 970, 971}, {626, 627, 628, 629, 630, 631}},
      {1, 1675, 6718, 1837, 6722, 20, 12220471, 0xa785e3a318d297f4ULL, {1838, 1839, 1840, 1841, 1842, 1843}, {16, 17, 18, 19, 20, 21}},
      {1599, 3923, 15727, 1159, 15731, 891, 10538083, 0x1117d112025f54a4ULL, {1160, 1161, 1162, 1163, 1164, 1165}, {887, 888, 889, 890, 891, 892}},
      {8323, 6343, 25414, 710, 25418, 264, 13116802, 0x41b21776c6bc69ebULL, {711, 712, 713, 714, 715, 716}, {260, 261, 262, 263, 264, 265}},
  });
}

TEST(DataMockDataset, TwoEpochsSeparateFinalEpoch) {
  // 20000 samples need 2 epochs; the final one gives 3352 < int(0.8*16648) samples, so it is
  // shuffled apart (document index and shuffle index).
  const MockGPTDataset mock({32000, 31999, 4096, 20000});
  const GPTDataset& ds = mock.gpt();
  EXPECT_EQ(ds.num_epochs(), 2);
  EXPECT_TRUE(ds.separate_final_epoch());
  EXPECT_EQ(ds.size(), 33296);
  ASSERT_EQ(ds.document_index().size(), 66666u);
  EXPECT_EQ(slice(ds.document_index(), 0, 10),
            (std::vector<int32_t>{30903, 11571, 3134, 32473, 27454, 4409, 3622, 19425, 2854, 4679}));
  EXPECT_EQ(slice(ds.document_index(), 33333, 10),
            (std::vector<int32_t>{29072, 25520, 26790, 22197, 20588, 2923, 22729, 11119, 8403, 8209}));
  EXPECT_EQ(fnv1a(ds.document_index()), 0xccc08d60e733eff1ULL);
  EXPECT_EQ(row(ds, 33296), (std::vector<int64_t>{66665, 1543}));
  EXPECT_EQ(fnv1a(ds.sample_index()), 0x46f05531daf45bfaULL);
  EXPECT_EQ(slice(ds.shuffle_index(), 0, 10),
            (std::vector<int64_t>{15322, 8949, 5332, 11819, 9234, 3024, 10378, 9692, 14637, 1596}));
  EXPECT_EQ(slice(ds.shuffle_index(), 16648, 10),
            (std::vector<int64_t>{23111, 23748, 21091, 32831, 30023, 23887, 17591, 31867, 28960, 24055}));
  EXPECT_EQ(fnv1a(ds.shuffle_index()), 0xd1537294e888f83bULL);
  check_samples(ds, {
      {0, 15322, 30700, 8, 30701, 161, 7816819, 0x485fd2d971041e40ULL, {9, 10, 11, 12, 13, 14}, {157, 158, 159, 160, 161, 162}},
      {16647, 6598, 13234, 799, 13235, 2342, 5716023, 0x5fde1688f9772360ULL, {800, 801, 802, 803, 804, 805}, {2338, 2339, 2340, 2341, 2342, 2343}},
      {16648, 23111, 46264, 1394, 46265, 2435, 6692935, 0x9b5558bcffc53726ULL, {1395, 1396, 1397, 1398, 1399, 1400}, {2431, 2432, 2433, 2434, 2435, 2436}},
      {20000, 18697, 37419, 139, 37420, 1477, 4917153, 0xc5c39d298fdb4a48ULL, {140, 141, 142, 143, 144, 145}, {1473, 1474, 1475, 1476, 1477, 1478}},
      {33295, 33084, 66234, 3021, 66236, 2629, 4976388, 0x77e25c63ac39a945ULL, {3022, 3023, 3024, 3025, 3026, 3027}, {2625, 2626, 2627, 2628, 2629, 2630}},
  });
}

TEST(DataMockDataset, TwoEpochsShuffledTogether) {
  // 30648 samples: the final epoch gives 14000 >= int(0.8*16648) = 13318, one joint shuffle.
  const MockGPTDataset mock({32000, 31999, 4096, 30648});
  const GPTDataset& ds = mock.gpt();
  EXPECT_EQ(ds.num_epochs(), 2);
  EXPECT_FALSE(ds.separate_final_epoch());
  EXPECT_EQ(ds.size(), 33296);
  EXPECT_EQ(slice(ds.document_index(), 0, 10),
            (std::vector<int32_t>{21653, 7273, 15558, 10003, 11086, 3399, 7986, 31285, 9471, 25743}));
  EXPECT_EQ(slice(ds.document_index(), 33333, 10),
            (std::vector<int32_t>{580, 17123, 26654, 1733, 11866, 1195, 6782, 32894, 28106, 25502}));
  EXPECT_EQ(fnv1a(ds.document_index()), 0xe5b2d6f85dde2455ULL);
  EXPECT_EQ(row(ds, 1), (std::vector<int64_t>{1, 1077}));
  EXPECT_EQ(row(ds, 33296), (std::vector<int64_t>{66665, 3336}));
  EXPECT_EQ(fnv1a(ds.sample_index()), 0x3015c6cd6f21bb43ULL);
  EXPECT_EQ(slice(ds.shuffle_index(), 0, 10),
            (std::vector<int64_t>{10660, 7018, 7217, 30175, 7686, 18885, 14048, 7765, 30492, 11620}));
  EXPECT_EQ(fnv1a(ds.shuffle_index()), 0x9508635ba2b7cfd9ULL);
  check_samples(ds, {
      {0, 10660, 21398, 743, 21400, 1378, 3746054, 0x32e3bd9357c989b1ULL, {744, 745, 746, 747, 748, 749}, {1374, 1375, 1376, 1377, 1378, 1379}},
      {16648, 25122, 50341, 1455, 50342, 1744, 7740865, 0x83279f93569a1dfcULL, {1456, 1457, 1458, 1459, 1460, 1461}, {1740, 1741, 1742, 1743, 1744, 1745}},
      {30647, 1158, 2273, 856, 2275, 1197, 3965592, 0x5a8007a3d4646e45ULL, {857, 858, 859, 860, 861, 862}, {1193, 1194, 1195, 1196, 1197, 1198}},
      {33295, 24086, 48287, 455, 48288, 2813, 5398417, 0x13ecdfeb826514f8ULL, {456, 457, 458, 459, 460, 461}, {2809, 2810, 2811, 2812, 2813, 2814}},
  });
}

TEST(DataMockDataset, SmallVocab) {
  // vocab 512, eod 511: same indices as vocab 32000, tokens k % 512, and 511 inside documents.
  const MockGPTDataset mock({512, 511, 4096, 64});
  const GPTDataset& ds = mock.gpt();
  EXPECT_EQ(ds.size(), 16648);
  check_samples(ds, {
      {0, 2298, 4637, 610, 4639, 763, 988458, 0xa5f9813a82d1193dULL, {99, 100, 101, 102, 103, 104}, {247, 248, 249, 250, 251, 252}},
      {1, 5404, 10815, 3436, 10819, 918, 979764, 0x60d3c55fd4ea3873ULL, {365, 366, 367, 368, 369, 370}, {402, 403, 404, 405, 406, 407}},
      {63, 10894, 21840, 1568, 21842, 311, 973658, 0xb6d29897f6f500f5ULL, {33, 34, 35, 36, 37, 38}, {307, 308, 309, 310, 311, 312}},
  });
  std::vector<int32_t> text(4097);
  mock.sample(0, text);
  EXPECT_EQ(std::count(text.begin(), text.end(), 511), 9);  // 2 real EODs + 7 mid-document 511s
}

TEST(DataMockDataset, MicroBatchSamplerOrder) {
  const int64_t seq = 4096, gbs = 64, mbs = 4;
  const MockGPTDataset mock({32000, 31999, seq, 50 * gbs});
  std::vector<int32_t> tokens(mbs * seq), labels(mbs * seq), text(seq + 1);
  for (const auto& [it, m] : {std::pair<int64_t, int64_t>{0, 0}, {0, 15}, {49, 15}, {7, 3}}) {
    mock.micro_batch(it * gbs, m, mbs, tokens, labels);
    for (int64_t b = 0; b < mbs; ++b) {
      mock.sample(it * gbs + m * mbs + b, text);
      for (int64_t t = 0; t < seq; ++t) {
        ASSERT_EQ(tokens[static_cast<size_t>(b * seq + t)], text[static_cast<size_t>(t)]);
        ASSERT_EQ(labels[static_cast<size_t>(b * seq + t)], text[static_cast<size_t>(t + 1)]);
      }
    }
  }
  // Iteration 0, micro-batch 0 is dataset indices 0..3 (golden sample 0 starts 611, 612, ...).
  mock.micro_batch(0, 0, mbs, tokens, labels);
  EXPECT_EQ(tokens[0], 611);
  EXPECT_EQ(labels[0], 612);
  EXPECT_EQ(tokens[seq], 3437);  // sample 1
  EXPECT_EQ(labels[seq - 1], 764);
}

TEST(DataMockDataset, Errors) {
  EXPECT_THROW(MockGPTDataset({32000, 31999, 0, 10}), pl::Error);
  EXPECT_THROW(MockGPTDataset({1, 0, 4096, 10}), pl::Error);
  EXPECT_THROW(MockGPTDataset({32000, 32000, 4096, 10}), pl::Error);
  EXPECT_THROW(MockGPTDataset({32000, 31999, 4096, -1}), pl::Error);
  const MockGPTDataset mock({32000, 31999, 4096, 64});
  std::vector<int32_t> text(4097), tokens(4 * 4096), labels(4 * 4096);
  EXPECT_THROW(mock.sample(mock.size(), text), pl::Error);
  EXPECT_THROW(mock.sample(-1, text), pl::Error);
  std::vector<int32_t> short_text(4096);
  EXPECT_THROW(mock.sample(0, short_text), pl::Error);
  EXPECT_THROW(mock.micro_batch(0, 0, 5, tokens, labels), pl::Error);            // buffers hold 4 samples
  EXPECT_THROW(mock.micro_batch(-1, 0, 4, tokens, labels), pl::Error);
  EXPECT_THROW(mock.micro_batch(261 * 64, 0, 4, tokens, labels), pl::Error);     // past 16648 samples
  EXPECT_THROW(mock.micro_batch(260 * 64, 2, 4, tokens, labels), pl::Error);     // 16648..16651
  mock.micro_batch(260 * 64, 1, 4, tokens, labels);                              // 16644..16647 exist
}

TEST(DataMockDataset, BuildTime) {
  const auto t0 = std::chrono::steady_clock::now();
  const MockGPTDataset mock({128256, 128001, 4096, 3200});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("build_ms", std::to_string(ms));
  std::printf("  mock index build (seq 4096, 3200 samples): %.2f ms\n", ms);
  EXPECT_EQ(mock.size(), 16648);
  EXPECT_LT(ms, 2000.0);  // generous: it takes a few ms
}

// ---- GPTDataset over a generic low-level dataset ----------------------------------------------------
// Sequence i has token 1000*i + k at offset k; lengths default_rng(7).integers(1, 20, 50, int32).
class TableDataset final : public LowLevelDataset {
 public:
  TableDataset() : lengths_(Pcg64(7).integers(1, 20, 50)) {}
  std::span<const int32_t> sequence_lengths() const override { return lengths_; }
  void get(int64_t seq, int64_t offset, int64_t length, int32_t* out) const override {
    for (int64_t k = offset; k < offset + length; ++k) *out++ = static_cast<int32_t>(1000 * seq + k);
  }

 private:
  std::vector<int32_t> lengths_;
};

std::vector<int32_t> range_indices(int64_t b, int64_t e) {
  std::vector<int32_t> v;
  for (int64_t i = b; i < e; ++i) v.push_back(static_cast<int32_t>(i));
  return v;
}

std::vector<int32_t> text_of(const GPTDataset& ds, int64_t idx) {
  std::vector<int32_t> t(static_cast<size_t>(ds.sample_length()));
  ds.get(idx, t);
  return t;
}

TEST(DataGPTDataset, TableLengthsFromPcg64) {
  const TableDataset table;
  const auto L = table.sequence_lengths();
  EXPECT_EQ(std::vector<int32_t>(L.begin(), L.end()),
            (std::vector<int32_t>{18, 12, 13, 18, 11, 15, 16, 5,  2,  6,  6,  17, 18, 1,  10, 16, 3,
                                  16, 3,  9,  16, 6,  7,  6,  14, 5,  19, 9,  10, 10, 12, 11, 10, 19,
                                  16, 16, 14, 12, 7,  19, 9,  5,  17, 4,  17, 12, 3,  1,  9,  1}));
}

TEST(DataGPTDataset, ThreeEpochsSeparateFinal) {
  auto table = std::make_shared<TableDataset>();
  GPTDatasetConfig cfg;
  cfg.sequence_length = 8;
  const GPTDataset ds(table, range_indices(0, 30), 100, Split::train, cfg);
  EXPECT_EQ(ds.tokens_per_epoch(), 317);
  EXPECT_EQ(ds.num_epochs(), 3);
  EXPECT_TRUE(ds.separate_final_epoch());
  EXPECT_EQ(ds.size(), 118);
  EXPECT_EQ(ds.document_index(),
            (std::vector<int32_t>{29, 15, 8,  22, 6,  24, 9,  13, 18, 1,  21, 3,  4,  20, 16, 27, 21, 20,
                                  10, 7,  26, 14, 17, 25, 12, 2,  1,  27, 28, 2,  5,  10, 6,  0,  11, 3,
                                  4,  7,  25, 9,  16, 5,  28, 18, 14, 29, 13, 0,  26, 11, 23, 19, 15, 24,
                                  22, 12, 23, 8,  19, 17, 1,  23, 10, 0,  29, 16, 28, 11, 21, 20, 3,  4,
                                  7,  25, 13, 5,  2,  14, 18, 17, 15, 19, 26, 22, 27, 6,  12, 24, 8,  9}));
  EXPECT_EQ(fnv1a(ds.sample_index()), 0xb1c5f43c70e64a60ULL);
  EXPECT_EQ(row(ds, 118), (std::vector<int64_t>{88, 1}));
  EXPECT_EQ(slice(ds.shuffle_index(), 0, 20),
            (std::vector<int64_t>{58, 37, 38, 29, 6, 28, 69, 74, 10, 7, 27, 35, 66, 60, 31, 65, 47, 57, 61, 25}));
  EXPECT_EQ(fnv1a(ds.shuffle_index()), 0x2ec26e9574fd2f8eULL);
  EXPECT_EQ(text_of(ds, 0), (std::vector<int32_t>{14008, 14009, 29000, 29001, 29002, 29003, 29004, 29005, 29006}));
  EXPECT_EQ(text_of(ds, 1), (std::vector<int32_t>{2001, 2002, 2003, 2004, 2005, 2006, 2007, 2008, 2009}));
  EXPECT_EQ(text_of(ds, 117), (std::vector<int32_t>{7001, 7002, 7003, 7004, 25000, 25001, 25002, 25003, 25004}));
}

TEST(DataGPTDataset, TwoEpochsOtherSeed) {
  auto table = std::make_shared<TableDataset>();
  GPTDatasetConfig cfg;
  cfg.sequence_length = 8;
  cfg.random_seed = 99;
  const GPTDataset ds(table, range_indices(0, 30), 40, Split::train, cfg);
  EXPECT_EQ(ds.num_epochs(), 2);
  EXPECT_TRUE(ds.separate_final_epoch());
  EXPECT_EQ(ds.size(), 79);
  EXPECT_EQ(ds.document_index(),
            (std::vector<int32_t>{23, 24, 16, 12, 21, 27, 10, 15, 2,  7,  22, 14, 6,  11, 13, 0,  19, 17, 28, 29,
                                  20, 5,  4,  18, 26, 9,  8,  25, 3,  1,  21, 8,  24, 22, 29, 23, 1,  18, 13, 19,
                                  25, 11, 2,  10, 6,  16, 3,  20, 27, 0,  9,  17, 12, 4,  14, 5,  28, 26, 15, 7}));
  EXPECT_EQ(fnv1a(ds.sample_index()), 0x82214b20b38dbe69ULL);
  EXPECT_EQ(row(ds, 79), (std::vector<int64_t>{59, 3}));
  EXPECT_EQ(slice(ds.shuffle_index(), 0, 20),
            (std::vector<int64_t>{31, 35, 22, 21, 14, 17, 20, 34, 7, 28, 1, 4, 38, 15, 30, 5, 36, 27, 8, 26}));
  EXPECT_EQ(fnv1a(ds.shuffle_index()), 0x4293c14919f0a438ULL);
  EXPECT_EQ(text_of(ds, 0), (std::vector<int32_t>{4007, 4008, 4009, 4010, 18000, 18001, 18002, 26000, 26001}));
  EXPECT_EQ(text_of(ds, 1), (std::vector<int32_t>{8000, 8001, 25000, 25001, 25002, 25003, 25004, 3000, 3001}));
  EXPECT_EQ(text_of(ds, 78), (std::vector<int32_t>{26014, 26015, 26016, 26017, 26018, 15000, 15001, 15002, 15003}));
}

TEST(DataGPTDataset, ValidSplitKeepsPaddedLastSample) {
  // drop_last_partial_validation_sequence = false: ceil((188-1)/16) = 12 samples, the last padded.
  auto table = std::make_shared<TableDataset>();
  GPTDatasetConfig cfg;
  cfg.sequence_length = 16;
  cfg.drop_last_partial_validation_sequence = false;
  const auto ranges = split_ranges("6,3,1", 50);
  const auto [b, e] = *ranges[1];
  const GPTDataset ds(table, range_indices(b, e), std::nullopt, Split::valid, cfg);
  EXPECT_EQ(ds.tokens_per_epoch(), 188);
  EXPECT_EQ(ds.num_epochs(), 1);
  EXPECT_EQ(ds.size(), 12);
  EXPECT_EQ(ds.document_index(), (std::vector<int32_t>{43, 41, 30, 42, 44, 32, 40, 37, 31, 39, 38, 34, 35, 36, 33}));
  EXPECT_EQ(fnv1a(ds.sample_index()), 0xcb9e49acdd0b9305ULL);
  EXPECT_EQ(row(ds, 12), (std::vector<int64_t>{14, 18}));
  EXPECT_EQ(ds.shuffle_index(), (std::vector<int64_t>{7, 11, 2, 3, 1, 9, 5, 4, 0, 8, 6, 10}));
  EXPECT_EQ(text_of(ds, 0), (std::vector<int32_t>{39015, 39016, 39017, 39018, 38000, 38001, 38002, 38003, 38004,
                                                  38005, 38006, 34000, 34001, 34002, 34003, 34004, 34005}));
  EXPECT_EQ(text_of(ds, 1), (std::vector<int32_t>{33007, 33008, 33009, 33010, 33011, 33012, 33013, 33014, 33015,
                                                  33016, 33017, 33018, -1, -1, -1, -1, -1}));
  EXPECT_EQ(text_of(ds, 11), (std::vector<int32_t>{36005, 36006, 36007, 36008, 36009, 36010, 36011, 36012, 36013,
                                                   33000, 33001, 33002, 33003, 33004, 33005, 33006, 33007}));
  // The same split with the default (drop the partial sample) has 11.
  cfg.drop_last_partial_validation_sequence = true;
  EXPECT_EQ(GPTDataset(table, range_indices(b, e), std::nullopt, Split::valid, cfg).size(), 11);
}

TEST(DataGPTDataset, LabelStreamIsContinuous) {
  // Consecutive samples (in sample-index order) overlap by exactly the one extra token.
  auto table = std::make_shared<TableDataset>();
  GPTDatasetConfig cfg;
  cfg.sequence_length = 8;
  const GPTDataset ds(table, range_indices(0, 30), 100, Split::train, cfg);
  std::vector<int64_t> inverse(static_cast<size_t>(ds.size()));
  for (int64_t i = 0; i < ds.size(); ++i) inverse[static_cast<size_t>(ds.shuffle_index()[static_cast<size_t>(i)])] = i;
  for (int64_t j = 0; j + 1 < ds.size(); ++j) {
    const auto a = text_of(ds, inverse[static_cast<size_t>(j)]);
    const auto b = text_of(ds, inverse[static_cast<size_t>(j + 1)]);
    ASSERT_EQ(a.back(), b.front()) << "sample " << j;
  }
}

TEST(DataGPTDataset, RejectsBadInputs) {
  auto table = std::make_shared<TableDataset>();
  GPTDatasetConfig cfg;
  cfg.sequence_length = 0;
  EXPECT_THROW(GPTDataset(table, range_indices(0, 30), 10, Split::train, cfg), pl::Error);
  cfg.sequence_length = 8;
  EXPECT_THROW(GPTDataset(table, range_indices(45, 51), 10, Split::train, cfg), pl::Error);  // index 50
  EXPECT_THROW(GPTDataset(table, {}, 10, Split::train, cfg), pl::Error);                     // no tokens
  const GPTDataset ds(table, range_indices(0, 30), 10, Split::train, cfg);
  std::vector<int32_t> t(9);
  EXPECT_THROW(ds.get(ds.size(), t), pl::Error);
  // seq_length 1 is accepted (Megatron's helpers.cpp asserts seq_length > 1): 316 two-token samples.
  cfg.sequence_length = 1;
  const GPTDataset one(table, range_indices(0, 30), 5, Split::train, cfg);
  EXPECT_EQ(one.size(), 316);
}

}  // namespace
