#pragma once
// Bit-exact re-implementations of the two numpy random streams Megatron's GPT datasets use
// (SPEC-MEGATRON §4 "RNG reimplementation"):
//
//   numpy.random.default_rng(seed)  = Generator(PCG64(SeedSequence(seed)))   -> Pcg64
//   numpy.random.RandomState(seed)  = legacy MT19937 seeded by init_genrand  -> RandomStateMt
//
// Written from the algorithm descriptions (numpy's bit_generator.pyx SeedSequence, pcg64.h,
// distributions.c random_interval / Lemire bounded integers, mtrand.pyx shuffle). The goldens in
// tests/data/test_numpy_rng.cpp were produced with real numpy.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace pl::data {

// numpy.random.SeedSequence(entropy) with no spawn key and pool_size 4: generate_state(n, uint32).
// `entropy` is a non-negative Python int given as its little-endian 32-bit words (0 -> {0}).
std::vector<uint32_t> seed_sequence_generate_state(std::span<const uint32_t> entropy, int n_words32);
// The uint32 words of a non-negative integer seed as numpy's SeedSequence sees them.
std::vector<uint32_t> seed_to_entropy_words(uint64_t seed);

// PCG64 (XSL-RR 128/64) as numpy.random.PCG64, seeded like numpy.random.default_rng(seed).
class Pcg64 {
 public:
  explicit Pcg64(uint64_t seed);
  // Seeded from the 128-bit initstate / initseq directly (pcg64_set_seed).
  Pcg64(uint64_t state_hi, uint64_t state_lo, uint64_t inc_hi, uint64_t inc_lo);

  uint64_t next_uint64();  // = bit_generator.random_raw(): one step, XSL-RR output
  uint32_t next_uint32();  // low half of a 64-bit output first, then its high half

  // Generator.integers(low, high, size=n, dtype=numpy.int32) (high exclusive; the int32 range
  // needs low >= -2^31, high <= 2^31, low < high): Lemire's bounded rejection on 32-bit draws,
  // numpy's rule (threshold tested only when leftover < range). A one-value range draws nothing.
  std::vector<int32_t> integers(int64_t low, int64_t high, int64_t n);
  // One draw in [0, rng] (inclusive), as numpy's buffered_bounded_lemire_uint32.
  uint32_t bounded_lemire_uint32(uint32_t rng);

 private:
  void step();
  using u128 = unsigned __int128;  // GCC/Clang extension
  u128 state_ = 0;
  u128 inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// numpy.random.RandomState(seed): MT19937 with init_genrand(seed) (== std::mt19937(seed)).
class RandomStateMt {
 public:
  explicit RandomStateMt(uint32_t seed);

  uint32_t next_uint32();  // genrand_int32 (tempered)
  uint64_t next_uint64();  // numpy mt19937_next64: first draw is the high word

  // numpy random_interval(max): a value in [0, max] by masked rejection; 32-bit draws when
  // max <= 2^32-1, else 64-bit draws.
  uint64_t random_interval(uint64_t max);

  // RandomState.shuffle on a 1-D array: for i = n-1 down to 1, j = random_interval(i), swap.
  // The permutation depends only on the length, not on the element type.
  template <class T>
  void shuffle(std::span<T> x) {
    for (size_t i = x.size(); i-- > 1;) {
      const size_t j = static_cast<size_t>(random_interval(i));
      std::swap(x[i], x[j]);
    }
  }
  template <class T>
  void shuffle(std::vector<T>& x) {
    shuffle(std::span<T>(x));
  }

 private:
  void twist();
  uint32_t mt_[624];
  int pos_ = 624;
};

}  // namespace pl::data
