#include "data/numpy_rng.h"

#include <cstdint>

#include "core/error.h"

namespace pl::data {

// ---- SeedSequence (numpy bit_generator.pyx) ------------------------------------------------------
namespace {
constexpr int kPoolSize = 4;
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;

// (generate_state's output step is the same mix with kMultB.)
uint32_t hashmix(uint32_t value, uint32_t& hash_const, uint32_t mult = kMultA) {
  value ^= hash_const;
  hash_const *= mult;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}
}  // namespace

std::vector<uint32_t> seed_to_entropy_words(uint64_t seed) {
  std::vector<uint32_t> w;
  if (seed == 0) w.push_back(0);
  while (seed > 0) {
    w.push_back(static_cast<uint32_t>(seed & 0xffffffffu));
    seed >>= 32;
  }
  return w;
}

std::vector<uint32_t> seed_sequence_generate_state(std::span<const uint32_t> entropy, int n_words32) {
  // mix_entropy: fill the pool, cross-mix it, then fold in any entropy beyond the pool size.
  uint32_t pool[kPoolSize];
  uint32_t hc = kInitA;
  for (int i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(static_cast<size_t>(i) < entropy.size() ? entropy[i] : 0u, hc);
  for (int src = 0; src < kPoolSize; ++src)
    for (int dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hc));
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hc));

  // generate_state: cycle over the pool.
  std::vector<uint32_t> out(static_cast<size_t>(n_words32));
  uint32_t hb = kInitB;
  for (int i = 0; i < n_words32; ++i) out[static_cast<size_t>(i)] = hashmix(pool[i % kPoolSize], hb, kMultB);
  return out;
}

// ---- PCG64 ---------------------------------------------------------------------------------------
namespace {
using u128 = unsigned __int128;
constexpr u128 kPcgMult = (static_cast<u128>(0x2360ED051FC65DA4ull) << 64) | 0x4385DF649FCCF645ull;
}  // namespace

Pcg64::Pcg64(uint64_t state_hi, uint64_t state_lo, uint64_t inc_hi, uint64_t inc_lo) {
  const u128 initstate = (static_cast<u128>(state_hi) << 64) | state_lo;
  const u128 initseq = (static_cast<u128>(inc_hi) << 64) | inc_lo;
  state_ = 0;
  inc_ = (initseq << 1) | 1u;
  step();
  state_ += initstate;
  step();
}

Pcg64::Pcg64(uint64_t seed) {
  // generate_state(4, uint64): 8 uint32 words, paired little-endian into 4 uint64.
  const std::vector<uint32_t> w = seed_sequence_generate_state(seed_to_entropy_words(seed), 8);
  uint64_t w64[4];
  for (int k = 0; k < 4; ++k) w64[k] = static_cast<uint64_t>(w[2 * k]) | (static_cast<uint64_t>(w[2 * k + 1]) << 32);
  *this = Pcg64(w64[0], w64[1], w64[2], w64[3]);
}

void Pcg64::step() { state_ = state_ * kPcgMult + inc_; }

uint64_t Pcg64::next_uint64() {
  step();
  const uint64_t hi = static_cast<uint64_t>(state_ >> 64);
  const uint64_t lo = static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  const uint64_t x = hi ^ lo;
  return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t Pcg64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffu);
}

uint32_t Pcg64::bounded_lemire_uint32(uint32_t rng) {
  const uint32_t rng_excl = rng + 1;  // rng < 2^32-1 here
  uint64_t m = static_cast<uint64_t>(next_uint32()) * rng_excl;
  uint32_t leftover = static_cast<uint32_t>(m & 0xffffffffu);
  if (leftover < rng_excl) {
    const uint32_t threshold = (UINT32_MAX - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(next_uint32()) * rng_excl;
      leftover = static_cast<uint32_t>(m & 0xffffffffu);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

std::vector<int32_t> Pcg64::integers(int64_t low, int64_t high, int64_t n) {
  PL_CHECK(low >= INT32_MIN && high <= static_cast<int64_t>(INT32_MAX) + 1 && low < high && n >= 0,
           "integers({}, {}, size={}): need INT32_MIN <= low < high <= 2^31 and size >= 0", low, high, n);
  std::vector<int32_t> out(static_cast<size_t>(n));
  // numpy: rng = high - 1 - low (closed interval), off = low.
  const auto rng = static_cast<uint32_t>(high - 1 - low);
  for (auto& v : out) {
    const uint32_t r = rng == 0 ? 0 : rng == UINT32_MAX ? next_uint32() : bounded_lemire_uint32(rng);
    v = static_cast<int32_t>(static_cast<uint32_t>(low) + r);
  }
  return out;
}

// ---- MT19937 (RandomState) -----------------------------------------------------------------------
RandomStateMt::RandomStateMt(uint32_t seed) {
  mt_[0] = seed;
  for (uint32_t i = 1; i < 624; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
  pos_ = 624;
}

void RandomStateMt::twist() {
  constexpr uint32_t kUpper = 0x80000000u, kLower = 0x7fffffffu, kMatrixA = 0x9908b0dfu;
  for (int i = 0; i < 624; ++i) {
    const uint32_t y = (mt_[i] & kUpper) | (mt_[(i + 1) % 624] & kLower);
    mt_[i] = mt_[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
  }
  pos_ = 0;
}

uint32_t RandomStateMt::next_uint32() {
  if (pos_ >= 624) twist();
  uint32_t y = mt_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t RandomStateMt::next_uint64() {
  const uint64_t hi = next_uint32();
  const uint64_t lo = next_uint32();
  return (hi << 32) | lo;
}

uint64_t RandomStateMt::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;  // every bit below max's highest set bit
  for (int shift = 1; shift < 64; shift *= 2) mask |= mask >> shift;
  while (true) {  // rejection sampling, one 32-bit draw per try while max fits in 32 bits
    const uint64_t value = (max <= 0xffffffffull ? next_uint32() : next_uint64()) & mask;
    if (value <= max) return value;
  }
}

}  // namespace pl::data
