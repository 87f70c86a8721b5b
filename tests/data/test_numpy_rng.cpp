// numpy-exact RNGs (SPEC-MEGATRON §4 "RNG reimplementation").
// Golden values: the first ten mock lengths and their sum come from the spec; every other value
// was printed by scripts/mock_data_golden.py running real numpy 2.4.6 (section "# RNG").
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "data/numpy_rng.h"

#include "test_util.h"

namespace {

using pl::test::fnv1a;  // the same fingerprint as scripts/mock_data_golden.py

using pl::data::Pcg64;
using pl::data::RandomStateMt;

TEST(DataNumpyRng, SeedSequenceGenerateState) {
  // numpy.random.SeedSequence(seed).generate_state(8, numpy.uint32)
  struct Case {
    uint64_t seed;
    std::vector<uint32_t> words;
  };
  const Case cases[] = {
      {0, {0xb0f478be, 0xdb2cd7e7, 0x2c71ba49, 0xabf4641a, 0x9d7b8d41, 0x20c6ed6d, 0x223c39d4, 0x2c4099de}},
      {1234, {0xad3f26a6, 0x5f83044c, 0x0cea3a6f, 0xa0d9b370, 0x1e3e7527, 0xa8647d8b, 0x00372192, 0x687a8e73}},
      {(1ull << 40) + 5,  // two entropy words
       {0xe08a170b, 0xdae41755, 0x7ecdcb2c, 0x8415abe8, 0x4b9118d0, 0x2525c5b4, 0x3392bed3, 0x42c2793f}},
  };
  for (const auto& c : cases) {
    const auto ent = pl::data::seed_to_entropy_words(c.seed);
    EXPECT_EQ(pl::data::seed_sequence_generate_state(ent, 8), c.words) << "seed " << c.seed;
  }
}

TEST(DataNumpyRng, Pcg64RandomRaw) {
  // numpy.random.default_rng(seed).bit_generator.random_raw(6)
  struct Case {
    uint64_t seed;
    std::vector<uint64_t> raw;
  };
  const Case cases[] = {
      {0,
       {11749869230777074271ULL, 4976686463289251617ULL, 755828109848996024ULL, 304881062738325533ULL,
        15002187965291974971ULL, 16837368535893154894ULL}},
      {1234,
       {18016930633132456890ULL, 7013373421822782593ULL, 17030886991259909300ULL, 4827373169039523470ULL,
        5886301771240251012ULL, 2178398751884474106ULL}},
      {(1ull << 40) + 5,
       {87427594128977387ULL, 6872972437549564694ULL, 10832470946844950135ULL, 2792830572878198040ULL,
        7746894934892277600ULL, 18186944250277267941ULL}},
  };
  for (const auto& c : cases) {
    Pcg64 g(c.seed);
    std::vector<uint64_t> got;
    for (size_t i = 0; i < c.raw.size(); ++i) got.push_back(g.next_uint64());
    EXPECT_EQ(got, c.raw) << "seed " << c.seed;
  }
}

TEST(DataNumpyRng, Pcg64Uint32IsLowHalfThenHighHalf) {
  Pcg64 a(0), b(0);
  const uint64_t r = a.next_uint64();
  EXPECT_EQ(b.next_uint32(), static_cast<uint32_t>(r));
  EXPECT_EQ(b.next_uint32(), static_cast<uint32_t>(r >> 32));
  EXPECT_EQ(b.next_uint64(), a.next_uint64());  // the 32-bit buffer does not feed 64-bit draws
}

TEST(DataNumpyRng, MockDocumentLengths) {
  // default_rng(0).integers(1, 4096, 100000, dtype=int32): spec §4 goldens (first ten, sum).
  Pcg64 g(0);
  const std::vector<int32_t> L = g.integers(1, 4096, 100000);
  ASSERT_EQ(L.size(), 100000u);
  const std::vector<int32_t> first10(L.begin(), L.begin() + 10);
  EXPECT_EQ(first10, (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331}));
  EXPECT_EQ(std::accumulate(L.begin(), L.end(), int64_t{0}), 204637097);
  const std::vector<int32_t> last5(L.end() - 5, L.end());
  EXPECT_EQ(last5, (std::vector<int32_t>{2815, 2592, 61, 100, 769}));  // numpy 2.4.6
}

TEST(DataNumpyRng, IntegersOtherRanges) {
  EXPECT_EQ(Pcg64(1234).integers(-5, 7, 20),
            (std::vector<int32_t>{6, 6, 6, -1, -3, 6, -4, -2, -4, -2, 1, -4, 4, -3, 4, -2, 4, 6, 6, -2}));
  // Ranges near 2^32 reach the rejection loop.
  EXPECT_EQ(Pcg64(3).integers(INT32_MIN, INT32_MAX, 10),
            (std::vector<int32_t>{1337901815, -1779623278, -1376791564, -1130390268, -1368527819, 1293963974,
                                  1585841955, 352883256, -1978265843, -1743204209}));
  EXPECT_EQ(Pcg64(3).integers(int64_t{INT32_MIN} + 1, INT32_MAX, 10),
            (std::vector<int32_t>{1337901815, -1779623277, -1376791563, -1130390267, -1368527818, 1293963974,
                                  1585841955, 352883256, -1978265842, -1743204208}));
  // The full int32 range takes raw 32-bit draws.
  EXPECT_EQ(Pcg64(5).integers(INT32_MIN, int64_t{INT32_MAX} + 1, 6),
            (std::vector<int32_t>{733537704, 1309977582, -2050188811, 1322595621, -133780032, 65822783}));
  // A one-value range consumes no draws.
  Pcg64 g(5);
  EXPECT_EQ(g.integers(9, 10, 3), (std::vector<int32_t>{9, 9, 9}));
  EXPECT_EQ(g.next_uint64(), 14849682912918955432ULL);
}

TEST(DataNumpyRng, IntegersRejectsBadRanges) {
  EXPECT_THROW(Pcg64(0).integers(5, 5, 1), pl::Error);
  EXPECT_THROW(Pcg64(0).integers(0, int64_t{INT32_MAX} + 2, 1), pl::Error);
  EXPECT_THROW(Pcg64(0).integers(int64_t{INT32_MIN} - 1, 0, 1), pl::Error);
}

TEST(DataNumpyRng, Mt19937Raw) {
  // numpy.random.RandomState(1234)._bit_generator.random_raw(8)
  RandomStateMt rs(1234);
  std::vector<uint32_t> got;
  for (int i = 0; i < 8; ++i) got.push_back(rs.next_uint32());
  EXPECT_EQ(got, (std::vector<uint32_t>{822569775, 2137449171, 2671936806, 3512589365, 1880026316, 2629000564,
                                        3373089432, 3312965625}));
  // RandomState's init_genrand is std::mt19937's seeding: the streams agree for good.
  RandomStateMt a(1234);
  std::mt19937 b(1234);
  for (int i = 0; i < 5000; ++i) ASSERT_EQ(a.next_uint32(), b()) << "draw " << i;
}

TEST(DataNumpyRng, ShuffleLikeRandomState) {
  // rs = RandomState(1234); rs.shuffle(arange(33333, int32)); rs.shuffle(arange(16648, uint32));
  // rs.shuffle(arange(10, int64)) -- the mock dataset's document and sample shuffles.
  RandomStateMt rs(1234);
  std::vector<int32_t> a(33333);
  std::iota(a.begin(), a.end(), 0);
  rs.shuffle(a);
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 20),
            (std::vector<int32_t>{30903, 11571, 3134, 32473, 27454, 4409, 3622, 19425, 2854, 4679, 24138, 29310,
                                  4098, 12830, 23634, 5238, 30167, 15516, 12262, 21992}));
  EXPECT_EQ(std::vector<int32_t>(a.end() - 5, a.end()), (std::vector<int32_t>{9449, 32399, 17048, 23924, 27439}));
  EXPECT_EQ(fnv1a(a), 0x203735d13adf3e25ULL);

  std::vector<uint32_t> b(16648);
  std::iota(b.begin(), b.end(), 0u);
  rs.shuffle(b);
  EXPECT_EQ(std::vector<uint32_t>(b.begin(), b.begin() + 20),
            (std::vector<uint32_t>{2298, 5404, 9985, 15861, 4049, 12744, 3177, 14934, 8849, 2784, 13778, 6680, 6794,
                                   11227, 11855, 11712, 13502, 507, 3429, 14238}));
  EXPECT_EQ(fnv1a(b), 0xc9dbffbb331fc27fULL);

  std::vector<int64_t> c(10);
  std::iota(c.begin(), c.end(), int64_t{0});
  rs.shuffle(c);
  EXPECT_EQ(c, (std::vector<int64_t>{9, 0, 2, 4, 3, 7, 8, 5, 1, 6}));
}

TEST(DataNumpyRng, RandomIntervalDrawWidths) {
  // Legacy randint(0, max+1, dtype=int64) uses the same masked rejection as random_interval(max).
  // max = 2^33: 64-bit draws, the first 32-bit output is the high word.
  RandomStateMt rs(1234);
  std::vector<uint64_t> got;
  for (int i = 0; i < 6; ++i) got.push_back(rs.random_interval(1ull << 33));
  EXPECT_EQ(got, (std::vector<uint64_t>{2629000564ull, 3312965625ull, 682106748ull, 2090933724ull, 5716667728ull,
                                        7742278015ull}));
  // max = 2^32-1 uses 32-bit draws; max = 2^32 switches to 64-bit draws.
  RandomStateMt r7(7);
  got.clear();
  for (int i = 0; i < 4; ++i) got.push_back(r7.random_interval(0xffffffffull));
  EXPECT_EQ(got, (std::vector<uint64_t>{327741615ull, 976413892ull, 3349725721ull, 1369975286ull}));
  got.clear();
  for (int i = 0; i < 4; ++i) got.push_back(r7.random_interval(1ull << 32));
  EXPECT_EQ(got, (std::vector<uint64_t>{1322904761ull, 1133316631ull, 372560217ull, 1801189930ull}));
  EXPECT_EQ(r7.random_interval(0), 0u);
}

}  // namespace
