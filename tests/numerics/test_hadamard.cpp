// The 16-point random Hadamard transform (lib/numerics/hadamard.h, SPEC-NVFP4 §3): the sign mask, the
// orthogonality R·Rᵀ = I, BF16-representable outputs, bit-exact agreement with an exact integer
// reference rounded as specified (RN_bf16(RN_fp32(exact sum))), and linearity / norm sanity.
// The FP64-free implementation (FP32 butterfly / int64 / 288-bit paths) against two references kept
// here: the former double-precision implementation (bit-identical wherever its double sum was exact,
// which it reports), and an exact big-integer sum rounded to FP32 by round-to-odd to 53 bits then the
// hardware's double -> float conversion (a rounding method independent of the implementation's).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

#include "numerics/bf16.h"
#include "numerics/hadamard.h"

namespace pl {
namespace {

// Row i of R (= R applied to the unit vector e_i, since c' = c · R).
void rht_matrix(uint16_t mask, float R[16][16]) {
  for (int i = 0; i < 16; ++i) {
    float e[16] = {};
    e[i] = 1.0f;
    num::rht16(e, R[i], mask);
  }
}

// Exact reference: inputs are BF16 values with exponents in [-24, 20], so every 0.25*s*H*x term is an
// integer multiple of 2^-33 below 2^23 and the 16-term sum is exact in int64. One RN to float (the
// int64 -> float conversion; the 2^-33 scaling is exact), then RN to BF16.
float ref_rht_out(const float in[16], int j, uint16_t mask) {
  int64_t acc = 0;
  for (int i = 0; i < 16; ++i) {
    const int64_t v = static_cast<int64_t>(std::ldexp(static_cast<double>(in[i]), 31));  // exact: x*0.25*2^33
    const bool neg = ((std::popcount(static_cast<unsigned>(i & j)) & 1) != 0) != (((mask >> i) & 1) != 0);
    acc += neg ? -v : v;
  }
  return num::round_bf16(std::ldexp(static_cast<float>(acc), -33));
}

float hadamard_random_bf16(std::mt19937& rng, int min_exp, int max_exp) {
  const int e = min_exp + static_cast<int>(rng() % static_cast<unsigned>(max_exp - min_exp + 1));
  const float m = 1.0f + static_cast<float>(rng() % 128) / 128.0f;
  const float v = std::ldexp(m, e);
  return (rng() & 1) ? -v : v;
}

TEST(NumericsHadamard, SignMaskIsTeSignVector) {
  const int s[16] = {+1, +1, +1, -1, +1, -1, -1, -1, -1, -1, -1, +1, -1, +1, -1, -1};
  uint16_t mask = 0;
  for (int i = 0; i < 16; ++i)
    if (s[i] < 0) mask = static_cast<uint16_t>(mask | (1u << i));
  EXPECT_EQ(mask, num::kRhtSignMask);
  float R[16][16];
  rht_matrix(num::kRhtSignMask, R);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      const int h = (std::popcount(static_cast<unsigned>(i & j)) & 1) ? -1 : 1;
      EXPECT_EQ(R[i][j], 0.25f * static_cast<float>(s[i] * h)) << i << "," << j;
    }
}

TEST(NumericsHadamard, Orthogonal) {
  for (uint16_t mask : {num::kRhtSignMask, static_cast<uint16_t>(0)}) {
    float R[16][16];
    rht_matrix(mask, R);
    for (int a = 0; a < 16; ++a)
      for (int b = 0; b < 16; ++b) {
        double dot = 0;
        for (int k = 0; k < 16; ++k) dot += static_cast<double>(R[a][k]) * R[b][k];
        EXPECT_EQ(dot, a == b ? 1.0 : 0.0) << "mask " << mask << " (" << a << "," << b << ")";
      }
  }
}

TEST(NumericsHadamard, MatchesExactReferenceBitForBit) {
  std::mt19937 rng(2024);
  int64_t mismatches = 0, checked = 0;
  for (int t = 0; t < 60000; ++t) {
    float in[16], out[16];
    // Mix chunks of similar magnitude with outlier-heavy ones (wide exponent spread, where the FP32
    // rounding of the sum and the double-rounding subtleties matter).
    const bool wide = (t % 2) == 1;
    for (float& v : in) v = wide ? hadamard_random_bf16(rng, -24, 20) : hadamard_random_bf16(rng, -3, 3);
    if (t % 7 == 0) in[rng() % 16] = 0.0f;
    const uint16_t mask = (t % 3 == 0) ? static_cast<uint16_t>(0) : num::kRhtSignMask;
    num::rht16(in, out, mask);
    for (int j = 0; j < 16; ++j) {
      ASSERT_EQ(out[j], num::round_bf16(out[j]));  // BF16-representable
      const float ref = ref_rht_out(in, j, mask);
      if (num::float_bits(out[j]) != num::float_bits(ref)) ++mismatches;
      ++checked;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  // In place (out aliases in).
  float x[16], y[16];
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i) - 7.5f;
  num::rht16(x, y, num::kRhtSignMask);
  num::rht16(x, x, num::kRhtSignMask);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(x[i], y[i]);
}

TEST(NumericsHadamard, FloatRoundingBeforeBf16) {
  // A sum whose exact value lies just above a BF16 midpoint but rounds to the midpoint in FP32: the
  // specified order (FP32 first, then BF16 ties-to-even) rounds down, a direct BF16 rounding would
  // round up. Chunk: x0 = 4 * (1 + 2^-8) (exact sum 1 + 2^-8 for j with H[0][j] = +1) plus a tiny
  // term 4 * 2^-30 that FP32 drops (below half an FP32 ulp of 1).
  float in[16] = {};
  in[0] = 4.0f * (1.0f + 0x1p-8f);
  in[1] = 0x1p-28f;  // 0.25 * in[1] = 2^-30
  float out[16];
  num::rht16(in, out, 0);
  EXPECT_EQ(out[0], 1.0f);            // RN_fp32 -> 1 + 2^-8 exactly (a BF16 tie) -> even: 1.0
  EXPECT_EQ(out[1], 1.0f);            // column 1: H[1][1] = -1: 1 + 2^-8 - 2^-30 -> FP32 1 + 2^-8 -> 1.0
  EXPECT_EQ(ref_rht_out(in, 0, 0), 1.0f);
}

TEST(NumericsHadamard, LinearityAndNorm) {
  std::mt19937 rng(5);
  for (int t = 0; t < 2000; ++t) {
    float x[16], y[16], x4[16], y4[16];
    for (float& v : x) v = hadamard_random_bf16(rng, -4, 4);
    num::rht16(x, y, num::kRhtSignMask);
    for (int i = 0; i < 16; ++i) x4[i] = 4.0f * x[i];  // scaling by a power of two commutes exactly
    num::rht16(x4, y4, num::kRhtSignMask);
    double nx = 0, ny = 0;
    for (int i = 0; i < 16; ++i) {
      ASSERT_EQ(y4[i], 4.0f * y[i]);
      nx += static_cast<double>(x[i]) * x[i];
      ny += static_cast<double>(y[i]) * y[i];
    }
    ASSERT_NEAR(std::sqrt(ny), std::sqrt(nx), std::sqrt(nx) * 0x1p-8);  // orthogonal up to BF16 rounding
  }
  // Sign flip commutes; NaN and Inf propagate.
  float x[16], y[16], xn[16], yn[16];
  for (int i = 0; i < 16; ++i) {
    x[i] = static_cast<float>(i * i) * 0.125f;
    xn[i] = -x[i];
  }
  num::rht16(x, y, num::kRhtSignMask);
  num::rht16(xn, yn, num::kRhtSignMask);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(yn[i], -y[i]);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  num::rht16(x, y, num::kRhtSignMask);
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isnan(y[i]));
}

}  // namespace
}  // namespace pl

// ---- the FP64-free paths against the former double code and an exact reference -----------------------

namespace pl {
namespace {

// The former implementation (FP64), verbatim in its arithmetic. *exact is set to false when any double
// addition of the butterfly rounded (TwoSum error != 0, or a non-finite operand).
void rht16_double_ref(const float in[16], float out[16], uint16_t sign_mask, bool* exact) {
  double v[16];
  bool ok = true;
  for (int i = 0; i < 16; ++i) {
    const double t = 0.25 * static_cast<double>(in[i]);
    v[i] = ((sign_mask >> i) & 1u) ? -t : t;
  }
  const auto two_sum_exact = [](double a, double b, double s) {
    if (!std::isfinite(a) || !std::isfinite(b) || !std::isfinite(s)) return false;
    const double bb = s - a;
    return (a - (s - bb)) + (b - bb) == 0.0;
  };
  for (int len = 1; len < 16; len <<= 1)
    for (int i = 0; i < 16; i += 2 * len)
      for (int k = i; k < i + len; ++k) {
        const double a = v[k], b = v[k + len];
        v[k] = a + b;
        v[k + len] = a - b;
        ok = ok && two_sum_exact(a, b, v[k]) && two_sum_exact(a, -b, v[k + len]);
      }
  for (int j = 0; j < 16; ++j) out[j] = num::round_bf16(static_cast<float>(v[j]));
  if (exact) *exact = ok;
}

// Exact reference for finite inputs: the butterfly on signed big integers of 16-bit limbs (bit k worth
// 2^(k-149); 20 int64 limbs = 320 bits, normalized only to test for zero and at the end), then each
// output RN_fp32(sum * 0.25): the magnitude is truncated to 53 significant bits with round-to-odd (the
// lowest kept bit ORed with every dropped bit), scaled into a double exactly, and converted to float by
// the hardware (RN). Round-to-odd to p >= 24 + 2 bits followed by RN to 24 bits equals one RN of the
// exact value (Boldo & Melquiond), subnormal floats included. An exactly zero output gets the sign IEEE
// gives an exact zero result at each butterfly step (a + b is -0 only for (-0) + (-0)).
struct Big {
  static constexpr int kLimbs = 20;
  std::array<int64_t, kLimbs> limb{};
  bool negzero = false;  // meaningful when the value is zero
  // Normalized copy: limbs in [0, 2^16), the sign in the top limb.
  std::array<int64_t, kLimbs> normalized() const {
    std::array<int64_t, kLimbs> l = limb;
    for (int k = 0; k + 1 < kLimbs; ++k) {
      const int64_t carry = l[k] >> 16;  // arithmetic shift (floor)
      l[k] -= carry * 65536;
      l[k + 1] += carry;
    }
    return l;
  }
  bool is_zero() const {
    const auto l = normalized();
    return std::all_of(l.begin(), l.end(), [](int64_t x) { return x == 0; });
  }
};

float big_to_fp32_times_quarter(const Big& b) {
  std::array<int64_t, Big::kLimbs> limb = b.normalized();
  constexpr int kLimbs = Big::kLimbs;
  const bool neg = limb[kLimbs - 1] < 0;
  if (neg) {  // magnitude: 0 - value over the limbs
    int64_t borrow = 0;
    for (int k = 0; k < kLimbs; ++k) {
      const int64_t d = -limb[k] - borrow;
      borrow = d < 0 ? 1 : 0;
      limb[k] = d + borrow * 65536;
    }
  }
  int T = kLimbs - 1;
  while (T >= 0 && limb[T] == 0) --T;
  if (T < 0) return b.negzero ? -0.0f : 0.0f;
  // A 128-bit window of limbs T-7 .. T (missing ones zero): bit 0 is worth 2^(16(T-7) - 149).
  unsigned __int128 w = 0;
  for (int k = T; k >= T - 7; --k) w = (w << 16) | static_cast<unsigned __int128>(k >= 0 ? limb[k] : 0);
  bool dropped = false;
  for (int k = 0; k < T - 7; ++k) dropped = dropped || limb[k] != 0;
  const uint64_t w_hi = static_cast<uint64_t>(w >> 64);
  const int hi = w_hi != 0 ? 127 - std::countl_zero(w_hi) : 63 - std::countl_zero(static_cast<uint64_t>(w));
  const int shift = hi - 52;  // >= 60: limb T is nonzero
  uint64_t m = static_cast<uint64_t>(w >> shift);
  dropped = dropped || (w & ((static_cast<unsigned __int128>(1) << shift) - 1)) != 0;
  if (dropped) m |= 1u;  // round to odd
  const double d = std::ldexp(static_cast<double>(m), 16 * (T - 7) + shift - 149 - 2);  // exact (53 bits)
  const float f = static_cast<float>(d);
  return neg ? -f : f;
}

void exact_rht16_fp32(const float in[16], float out[16], uint16_t mask) {
  Big v[16];
  for (int i = 0; i < 16; ++i) {
    const uint32_t u = num::float_bits(in[i]);
    const uint32_t a = u & 0x7FFFFFFFu;
    const bool neg = ((u >> 31) ^ ((mask >> i) & 1u)) != 0;  // not (a != 0) != (b != 0): GCC 12 -O1 bug
    if (a == 0) {
      v[i].negzero = neg;
      continue;
    }
    const uint32_t e = a >> 23;
    const uint64_t sig = e ? ((a & 0x7FFFFFu) | 0x800000u) : a;
    const int pos = e ? static_cast<int>(e) - 1 : 0;
    const uint64_t bits = sig << (pos % 16);  // < 2^39: three limbs
    for (int k = 0; k < 3; ++k) {
      const int64_t part = static_cast<int64_t>((bits >> (16 * k)) & 0xFFFFu);
      v[i].limb[pos / 16 + k] = neg ? -part : part;
    }
  }
  for (int len = 1; len < 16; len <<= 1)
    for (int i = 0; i < 16; i += 2 * len)
      for (int k = i; k < i + len; ++k) {
        const Big a = v[k], b = v[k + len];
        const bool both_zero = a.is_zero() && b.is_zero();
        for (int l = 0; l < Big::kLimbs; ++l) {
          v[k].limb[l] = a.limb[l] + b.limb[l];
          v[k + len].limb[l] = a.limb[l] - b.limb[l];
        }
        v[k].negzero = both_zero && a.negzero && b.negzero;
        v[k + len].negzero = both_zero && a.negzero && !b.negzero;
      }
  for (int j = 0; j < 16; ++j) out[j] = big_to_fp32_times_quarter(v[j]);
}

struct Stats {
  int64_t blocks = 0, outputs = 0, double_exact_blocks = 0;
  int64_t path[4] = {};
  int64_t fast_accepted = 0, fast_two_lanes = 0;  // rht16_fast: accepted chunks, those needing the L lane
};

// rht16_fast's acceptance (hadamard.h), computed here from its definition with doubles and the exact
// reference's outputs (exact_fp32 = RN_fp32(exact sum * 0.25)); *two_lanes: some input is off the grid
// 2^(e_max-19).
bool fast_should_accept(const float in[16], const float exact_fp32[16], bool* two_lanes) {
  *two_lanes = false;
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) {
    if (!std::isfinite(in[i])) return false;
    amax = std::max(amax, std::fabs(in[i]));
  }
  if (amax == 0.0f) return true;
  const int e_max = std::ilogb(amax);
  if (e_max < -100 || e_max > 120) return false;
  const auto multiple_of = [](float x, int e) {  // x an integer multiple of 2^e (exact in double)
    const double q = std::ldexp(static_cast<double>(x), -e);
    return q == std::trunc(q);
  };
  for (int i = 0; i < 16; ++i) {
    if (!multiple_of(in[i], e_max - 39)) return false;
    if (!multiple_of(in[i], e_max - 19)) *two_lanes = true;
  }
  if (!*two_lanes) return true;
  for (int j = 0; j < 16; ++j)
    if (!(std::fabs(exact_fp32[j]) >= 0x1p-122f)) return false;  // |RN(S)| >= 2^-120
  return true;
}

// rht16 (in place and out of place) against the exact reference (always, for finite blocks) and the
// former double code (bitwise where it was exact, and always for non-finite blocks). Fails the test with
// the block on the first mismatch; returns false then.
bool check_block(const float in[16], uint16_t mask, Stats& st) {
  float out[16], inplace[16], dref[16];
  std::copy(in, in + 16, inplace);
  num::rht16(in, out, mask);
  num::rht16(inplace, inplace, mask);
  bool exact = false;
  rht16_double_ref(in, dref, mask, &exact);
  float exact_fp32[16];
  if (num::rht16_path(in) != num::RhtPath::kNonFinite) exact_rht16_fp32(in, exact_fp32, mask);
  const num::RhtPath path = num::rht16_path(in);
  ++st.blocks;
  ++st.path[static_cast<int>(path)];
  if (exact) ++st.double_exact_blocks;
  const auto dump = [&] {
    std::string s = "mask " + std::to_string(mask) + " path " + std::to_string(static_cast<int>(path)) + " in:";
    char buf[64];
    for (int i = 0; i < 16; ++i) {
      std::snprintf(buf, sizeof buf, " %a", static_cast<double>(in[i]));
      s += buf;
    }
    return s;
  };
  // The GPU's fast path: accepted exactly where its predicate holds, and then rht16's bits (in place too).
  {
    float fast[16], fast_inplace[16];
    std::copy(in, in + 16, fast_inplace);
    const bool accepted = num::rht16_fast(in, fast, mask);
    const bool accepted_inplace = num::rht16_fast(fast_inplace, fast_inplace, mask);
    bool two = false;
    const bool want = path != num::RhtPath::kNonFinite && fast_should_accept(in, exact_fp32, &two);
    if (accepted != want || accepted_inplace != want) {
      ADD_FAILURE() << "rht16_fast " << (accepted ? "accepts" : "rejects") << " a chunk its predicate "
                    << (want ? "accepts" : "rejects") << ": " << dump();
      return false;
    }
    if (accepted) {
      ++st.fast_accepted;
      st.fast_two_lanes += two ? 1 : 0;
      for (int j = 0; j < 16; ++j)
        if (num::float_bits(fast[j]) != num::float_bits(out[j]) ||
            num::float_bits(fast_inplace[j]) != num::float_bits(out[j])) {
          ADD_FAILURE() << "rht16_fast output " << j << ": " << std::hexfloat << fast[j] << " but rht16 gives "
                        << out[j] << std::defaultfloat << ": " << dump();
          return false;
        }
    }
  }
  for (int j = 0; j < 16; ++j) {
    ++st.outputs;
    if (num::float_bits(out[j]) != num::float_bits(inplace[j])) {
      ADD_FAILURE() << "in-place differs at output " << j << ": " << dump();
      return false;
    }
    if (num::float_bits(out[j]) != num::float_bits(num::round_bf16(out[j]))) {
      ADD_FAILURE() << "output " << j << " is not a BF16 value: " << dump();
      return false;
    }
    if (path == num::RhtPath::kNonFinite || exact) {
      if (num::float_bits(out[j]) != num::float_bits(dref[j])) {
        ADD_FAILURE() << "output " << j << ": " << out[j] << " but the double code gives " << dref[j] << ": "
                      << dump();
        return false;
      }
    }
    if (path != num::RhtPath::kNonFinite) {
      const float ref = num::round_bf16(exact_fp32[j]);
      if (num::float_bits(out[j]) != num::float_bits(ref)) {
        ADD_FAILURE() << "output " << j << ": " << std::hexfloat << out[j] << " but the exact reference gives "
                      << ref << std::defaultfloat << ": " << dump();
        return false;
      }
    }
  }
  return true;
}

// A BF16 value with floor(log2|v|) = e (e in [-133, 127]; below -126 a BF16 subnormal), random
// significand bits (full 8 bits when `full`), random sign.
float bf16_with_exp(std::mt19937& rng, int e, bool full) {
  uint32_t bits;
  if (e >= -126) {
    uint32_t mant = rng() & 0x7Fu;
    if (full) mant |= 1u;  // lowest significand bit set: the widest span for this exponent
    bits = (static_cast<uint32_t>(e + 127) << 23) | (mant << 16);
  } else {  // BF16 subnormal: value = m * 2^-133, m in [2^(e+133), 2^(e+134))
    const int b = e + 133;  // 0..6
    uint32_t m = (1u << b) | (rng() & ((1u << b) - 1u));
    if (full) m |= 1u;
    bits = m << 16;
  }
  if (rng() & 1u) bits |= 0x80000000u;
  return num::bits_float(bits);
}

uint16_t random_mask(std::mt19937& rng) {
  const uint32_t r = rng() % 4;
  return r == 0 ? static_cast<uint16_t>(0) : r == 1 ? num::kRhtSignMask : static_cast<uint16_t>(rng());
}

TEST(NumericsHadamard, RoundFp32HelperEdgeCases) {
  // Plain values and ties to even.
  EXPECT_EQ(num::rht_round_fp32(1, 0, false), 1.0f);
  EXPECT_EQ(num::rht_round_fp32(3, -1, true), -1.5f);
  EXPECT_EQ(num::rht_round_fp32((uint64_t{1} << 24) + 1, 0, false), 16777216.0f);  // tie -> even (down)
  EXPECT_EQ(num::rht_round_fp32((uint64_t{1} << 24) + 3, 0, false), 16777220.0f);  // tie -> even (up)
  EXPECT_EQ(num::rht_round_fp32((uint64_t{1} << 25) + 3, 0, false), 33554436.0f);  // above the tie
  EXPECT_EQ(num::rht_round_fp32((uint64_t{1} << 24) - 1, 1, false), 33554430.0f);
  EXPECT_EQ(num::rht_round_fp32(~uint64_t{0}, 0, false), 0x1p64f);                // carry into the next binade
  EXPECT_EQ(num::float_bits(num::rht_round_fp32(0, 5, true)), 0u);                 // zero is +0
  // Subnormals: quantum 2^-149; ties to even; underflow to a signed zero.
  EXPECT_EQ(num::rht_round_fp32(1, -149, false), 0x1p-149f);
  EXPECT_EQ(num::rht_round_fp32(1, -150, false), 0.0f);                            // tie -> 0 (even)
  EXPECT_EQ(num::rht_round_fp32(3, -151, false), 0x1p-149f);                       // 0.75 quantum -> 1
  EXPECT_EQ(num::rht_round_fp32(3, -150, false), 0x1p-148f);                       // 1.5 -> 2 (even)
  EXPECT_EQ(num::rht_round_fp32(5, -151, false), 0x1p-149f);                       // 1.25 -> 1
  EXPECT_EQ(num::float_bits(num::rht_round_fp32(1, -151, true)), 0x80000000u);     // -0.25 quantum -> -0
  EXPECT_EQ(num::rht_round_fp32((uint64_t{1} << 24) - 1, -150, false), 0x1p-126f); // rounds up to min normal
  EXPECT_EQ(num::rht_round_fp32((uint64_t{1} << 23) - 1, -149, false),
            num::bits_float(0x7FFFFFu));                                           // largest subnormal, exact
  EXPECT_EQ(num::rht_round_fp32(uint64_t{1} << 63, -213, false), 0.0f);            // shift 64: a tie -> 0
  EXPECT_EQ(num::rht_round_fp32((uint64_t{1} << 63) + 1, -213, false), 0x1p-149f); // above the tie -> 1
  EXPECT_EQ(num::rht_round_fp32(~uint64_t{0}, -300, true), -0.0f);                 // far below: -0
  // Overflow: FLT_MAX + half an ulp (2^104) and beyond -> Inf; just below the tie -> FLT_MAX.
  const float fmax = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(num::rht_round_fp32((uint64_t{1} << 25) - 1, 103, false), inf);        // 2^128 - 2^103: a tie -> Inf
  EXPECT_EQ(num::rht_round_fp32((uint64_t{1} << 26) - 3, 102, false), fmax);       // below the tie
  EXPECT_EQ(num::rht_round_fp32(1, 128, true), -inf);
  EXPECT_EQ(num::rht_round_fp32(1, 127, false), 0x1p127f);
  EXPECT_EQ(num::rht_round_fp32(1, 1000, false), inf);
}

TEST(NumericsHadamard, PathChoiceFollowsTheSpanBound) {
  std::mt19937 rng(17);
  // Typical data (Gaussian BF16 activations) takes the FP32 butterfly.
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int fast = 0, total = 0;
  for (int t = 0; t < 20000; ++t) {
    float in[16];
    for (float& v : in) v = num::round_bf16(nd(rng));
    fast += num::rht16_is_fp32_exact(in) ? 1 : 0;
    ++total;
  }
  EXPECT_GE(fast, total * 97 / 100) << fast << " of " << total;
  // Right at the bound: BF16 values with full 8-bit significands spanning 12 binades -> FP32; 13 -> int64.
  for (int e_hi = -112; e_hi <= 120; ++e_hi) {  // e_lo >= -126: normal BF16 values (lsb = e - 7)
    for (int span : {11, 12, 13, 14}) {
      const int e_lo = e_hi - span;
      float in[16];
      for (int i = 0; i < 16; ++i) in[i] = bf16_with_exp(rng, e_lo + static_cast<int>(rng() % (span + 1)), false);
      in[3] = bf16_with_exp(rng, e_hi, true);
      in[9] = bf16_with_exp(rng, e_lo, true);
      const num::RhtPath p = num::rht16_path(in);
      EXPECT_EQ(p, span <= 12 ? num::RhtPath::kFp32 : num::RhtPath::kInt64) << "e_hi " << e_hi << " span " << span;
      Stats st;
      ASSERT_TRUE(check_block(in, random_mask(rng), st));
    }
  }
  // Near the top of the range the FP32 butterfly could overflow: e_max + 5 > 128 takes the int64 path.
  float big[16] = {};
  big[0] = 0x1p123f;
  EXPECT_EQ(num::rht16_path(big), num::RhtPath::kFp32);
  big[0] = 0x1p124f;
  EXPECT_EQ(num::rht16_path(big), num::RhtPath::kInt64);
  // Very wide spans take the 288-bit path; zeros never count; non-finite inputs have their own path.
  float wide[16] = {};
  wide[0] = 1.0f;
  wide[1] = 0x1p-70f;
  EXPECT_EQ(num::rht16_path(wide), num::RhtPath::kWide);
  wide[1] = -0.0f;
  EXPECT_EQ(num::rht16_path(wide), num::RhtPath::kFp32);
  wide[2] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(num::rht16_path(wide), num::RhtPath::kNonFinite);
  float zeros[16] = {};
  EXPECT_TRUE(num::rht16_is_fp32_exact(zeros));
}

// Every pair of BF16 exponents (e_hi >= e_lo over the whole BF16 range, subnormals included) in one
// block, the other 14 values random between them (or zeros), a random sign mask.
TEST(NumericsHadamard, AllBf16ExponentPairsMatchExactSum) {
  std::mt19937 rng(4242);
  Stats st;
  for (int e_hi = -133; e_hi <= 127; ++e_hi)
    for (int e_lo = -133; e_lo <= e_hi; ++e_lo)
      for (int rep = 0; rep < 2; ++rep) {
        float in[16];
        for (int i = 0; i < 16; ++i) {
          const int e = e_lo + static_cast<int>(rng() % static_cast<unsigned>(e_hi - e_lo + 1));
          in[i] = (rng() % 8 == 0) ? ((rng() & 1) ? -0.0f : 0.0f) : bf16_with_exp(rng, e, false);
        }
        const unsigned a = rng() % 16, b = (a + 1 + rng() % 15) % 16;
        in[a] = bf16_with_exp(rng, e_hi, rep == 1);
        in[b] = bf16_with_exp(rng, e_lo, rep == 1);
        ASSERT_TRUE(check_block(in, random_mask(rng), st));
      }
  // Every path was exercised, and the double code was exact (so compared bitwise) on most blocks.
  EXPECT_GT(st.path[0], 1000);
  EXPECT_GT(st.path[1], 1000);
  EXPECT_GT(st.path[2], 1000);
  EXPECT_GT(st.double_exact_blocks, st.blocks / 5);
}

// Large terms cancelling exactly, leaving tiny ones (the result is decided by the tiny terms alone),
// and sums cancelling to exactly zero.
TEST(NumericsHadamard, CancellationLeavesTinyTerms) {
  std::mt19937 rng(77);
  Stats st;
  for (int t = 0; t < 40000; ++t) {
    const int e_big = -100 + static_cast<int>(rng() % 227);  // up to 2^126
    const int e_tiny = -133 + static_cast<int>(rng() % static_cast<unsigned>(std::max(1, e_big + 134)));
    float in[16];
    for (float& v : in) v = (rng() % 3 == 0) ? 0.0f : bf16_with_exp(rng, e_tiny, rng() & 1);
    // Two or four equal big magnitudes: for half of the outputs (or more) their signed terms cancel.
    const float big = std::fabs(bf16_with_exp(rng, e_big, rng() & 1));
    const int a = static_cast<int>(rng() % 16);
    const int b = (a + 1 + static_cast<int>(rng() % 15)) % 16;
    in[a] = (rng() & 1) ? big : -big;
    in[b] = (rng() & 1) ? big : -big;
    if (t % 2 == 0) {
      const int c = (b + 1 + static_cast<int>(rng() % 14)) % 16;
      if (c != a) in[c] = (rng() & 1) ? big : -big;
    }
    if (t % 5 == 0)  // nothing else: exact zeros in some outputs
      for (int i = 0; i < 16; ++i)
        if (i != a && i != b) in[i] = 0.0f;
    ASSERT_TRUE(check_block(in, random_mask(rng), st));
  }
  // A hand-made case: x0 = x1 = 2^100, x2 = 2^-120 (span 220 binades, the 288-bit path), no sign mask:
  // output 1 has +x0 -x1 +x2 -> 0.25 * 2^-120 exactly; output 0 has 2^101 + 2^-120 -> RN: 2^99.
  float in[16] = {};
  in[0] = 0x1p100f;
  in[1] = 0x1p100f;
  in[2] = 0x1p-120f;
  float out[16];
  num::rht16(in, out, 0);
  EXPECT_EQ(num::rht16_path(in), num::RhtPath::kWide);
  EXPECT_EQ(out[0], 0x1p99f);
  EXPECT_EQ(out[1], 0x1p-122f);
  EXPECT_EQ(out[2], 0x1p99f);                 // +x0 +x1 -x2 -> just below 2^99, rounds to it
  EXPECT_EQ(out[3], -0x1p-122f);              // +x0 -x1 -x2
  in[2] = 0.0f;
  num::rht16(in, out, 0);
  EXPECT_EQ(num::float_bits(out[1]), 0u);     // exact cancellation: +0
}

TEST(NumericsHadamard, SignedZerosMatchTheDoubleCode) {
  // All 2^16 sign patterns of zero blocks under three masks, and zero blocks with one nonzero value.
  Stats st;
  for (uint32_t signs = 0; signs < (1u << 16); signs += 7) {
    float in[16];
    for (int i = 0; i < 16; ++i) in[i] = ((signs >> i) & 1u) ? -0.0f : 0.0f;
    for (uint16_t mask : {static_cast<uint16_t>(0), num::kRhtSignMask, static_cast<uint16_t>(0xFFFF)})
      ASSERT_TRUE(check_block(in, mask, st));
    in[signs % 16] = (signs & 1u) ? -0x1p-133f : 3.0f;
    ASSERT_TRUE(check_block(in, num::kRhtSignMask, st));
  }
}

TEST(NumericsHadamard, NonFiniteInputsMatchTheDoubleCode) {
  std::mt19937 rng(99);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            num::bits_float(0x7F800001u), num::bits_float(0xFFC12345u)};
  Stats st;
  for (int t = 0; t < 20000; ++t) {
    float in[16];
    for (float& v : in) v = bf16_with_exp(rng, -133 + static_cast<int>(rng() % 261), false);
    const int k = 1 + static_cast<int>(rng() % 4);
    for (int n = 0; n < k; ++n) {
      // Mostly infinities (their sign pattern decides Inf vs NaN per output), sometimes a NaN.
      const int s = (rng() % 5 == 0) ? 2 + static_cast<int>(rng() % 4) : static_cast<int>(rng() % 2);
      in[rng() % 16] = specials[s];
    }
    ASSERT_TRUE(check_block(in, random_mask(rng), st));
  }
  // One +Inf: every output is +-Inf by its coefficient; +Inf and -Inf inputs: NaN where the signed
  // infinities disagree, Inf where they agree.
  float in[16] = {};
  in[5] = inf;
  float out[16];
  num::rht16(in, out, 0);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(out[j], num::rht_sign(5, j, 0) > 0 ? inf : -inf) << j;
  in[6] = inf;
  num::rht16(in, out, 0);
  for (int j = 0; j < 16; ++j) {
    if (num::rht_sign(5, j, 0) == num::rht_sign(6, j, 0))
      EXPECT_EQ(out[j], num::rht_sign(5, j, 0) > 0 ? inf : -inf) << j;
    else
      EXPECT_EQ(num::float_bits(out[j]), 0x7FFF0000u) << j;  // BF16's canonical NaN
  }
}

// Millions of random BF16 blocks: mostly realistic spans, some heavy-tailed, some over the whole range.
TEST(NumericsHadamard, RandomBf16BlocksMatchExactSum) {
  std::mt19937 rng(31337);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Stats st;
  int64_t gaussian = 0, gaussian_accepted = 0;
  for (int t = 0; t < 1000000; ++t) {
    float in[16];
    const int kind = t % 4;
    for (float& v : in) {
      if (kind == 0) {
        v = num::round_bf16(nd(rng));
      } else if (kind == 1) {  // heavy tails: a Gaussian times 2^U(-20, 20)
        v = num::round_bf16(std::ldexp(nd(rng), static_cast<int>(rng() % 41) - 20));
      } else if (kind == 2) {  // the whole BF16 range
        v = bf16_with_exp(rng, -133 + static_cast<int>(rng() % 261), rng() & 1);
      } else {  // random BF16 bit patterns (finite)
        uint32_t b;
        do b = (rng() & 0xFFFFu) << 16;
        while ((b & 0x7F800000u) == 0x7F800000u);
        v = num::bits_float(b);
      }
    }
    ASSERT_TRUE(check_block(in, random_mask(rng), st));
    if (kind == 0) {
      float out[16];
      ++gaussian;
      gaussian_accepted += num::rht16_fast(in, out, num::kRhtSignMask) ? 1 : 0;
    }
  }
  EXPECT_GT(st.double_exact_blocks, st.blocks / 3);  // kinds 0 and 1 (and a few others): compared bitwise
  EXPECT_GE(gaussian_accepted, gaussian - gaussian / 1000);  // activation-like chunks: the fast path
  EXPECT_GT(st.fast_accepted, st.blocks / 4);
  EXPECT_GT(st.fast_two_lanes, st.blocks / 40);
}

// What the GPU's quantizers gain: BF16 chunks spanning up to 32 binades (gradient-like data) stay on the
// FP32 fast path, where rht16_path's single FP32 butterfly takes only those spanning <= 12; beyond 39
// binades (an input off the grid 2^(e_max-39)) and for Inf/NaN the chunk goes to the exact fallback.
TEST(NumericsHadamard, FastPathTakesBf16ChunksSpanningUpTo32Binades) {
  std::mt19937 rng(4711);
  Stats st;
  int64_t narrow = 0, narrow_accepted = 0, wide = 0, wide_accepted = 0;
  for (int t = 0; t < 200000; ++t) {
    const int e_hi = -60 + static_cast<int>(rng() % 161);
    const int span = static_cast<int>(rng() % 48);
    float in[16];
    for (float& v : in) {
      const int e = e_hi - static_cast<int>(rng() % static_cast<unsigned>(span + 1));
      v = (rng() % 10 == 0) ? 0.0f : bf16_with_exp(rng, e, rng() & 1);
    }
    in[rng() % 16] = bf16_with_exp(rng, e_hi, false);
    ASSERT_TRUE(check_block(in, random_mask(rng), st));
    float out[16];
    const bool accepted = num::rht16_fast(in, out, num::kRhtSignMask);
    if (span <= 32) {
      ++narrow;
      narrow_accepted += accepted ? 1 : 0;
    } else if (span >= 40) {
      ++wide;
      wide_accepted += accepted ? 1 : 0;
    }
  }
  EXPECT_GE(narrow_accepted, narrow - narrow / 1000) << narrow_accepted << " of " << narrow;  // only exact cancellations
  EXPECT_LT(wide_accepted, wide) << "some chunk spanning >= 40 binades has an input off the grid 2^(e_max-39)";
  EXPECT_GT(st.fast_two_lanes, st.blocks / 3);
  // The accepted region's edges by hand: 1 next to 2^-32 (two lanes) and 1 next to 2^-40 (off the grid).
  float in[16] = {};
  float out[16];
  in[0] = 1.0f;
  in[3] = 0x1.02p-32f;
  EXPECT_TRUE(num::rht16_fast(in, out, num::kRhtSignMask));
  in[3] = 0x1.02p-40f;
  EXPECT_FALSE(num::rht16_fast(in, out, num::kRhtSignMask));
  in[3] = 0.0f;
  in[5] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(num::rht16_fast(in, out, num::kRhtSignMask));
}

// Full-FP32 inputs (as --fp32-reference feeds): random bit patterns, subnormals, wide and narrow spans.
TEST(NumericsHadamard, RandomFp32BlocksMatchExactSum) {
  std::mt19937 rng(2718);
  Stats st;
  for (int t = 0; t < 300000; ++t) {
    float in[16];
    const int e_hi = static_cast<int>(rng() % 254) + 1;  // biased exponents
    const int span = (t % 3 == 0) ? static_cast<int>(rng() % 8) : static_cast<int>(rng() % 254);
    for (float& v : in) {
      int e = e_hi - static_cast<int>(rng() % static_cast<unsigned>(span + 1));
      if (e < 0) e = 0;  // subnormal
      v = num::bits_float((static_cast<uint32_t>(e) << 23) | (rng() & 0x7FFFFFu) | (rng() & 0x80000000u));
    }
    ASSERT_TRUE(check_block(in, random_mask(rng), st));
  }
  EXPECT_GT(st.path[1], 10000);
  EXPECT_GT(st.path[2], 10000);
}

}  // namespace
}  // namespace pl
