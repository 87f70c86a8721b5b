#pragma once
// The 16-point random Hadamard transform of the NVFP4 recipe (SPEC-NVFP4 §3): a 16-element chunk c
// (a row vector, BF16 values) becomes c' = c · R with R = diag(s) · H16 · 0.25,
// H16[i][j] = (-1)^popcount(i & j), s_i = -1 where bit i of the sign mask is set.
// Output model: out_j = RN_bf16(RN_fp32(exact sum_i 0.25 * s_i * H[i][j] * in_i)), i.e. the tensor-core
// MMA is modelled as the correctly rounded FP32 sum, then cvt.rn.bf16.f32 (TE
// hadamard_transform_utils.cuh, hadamard_transform_cast_fusion.cu). Do not round the sum straight to
// BF16 (double rounding differs in rare cases, §3).
//
// No FP64 anywhere (GPU kernels call this; GB300-class GPUs have almost no FP64). The exact sum is
// formed by one of three paths, chosen per 16-element chunk by rht16_path():
//   kFp32:  a 4-stage FP32 butterfly on the unscaled signed inputs, then one multiply by 0.25f, when
//           every partial sum is provably exact in FP32 (the proof is at rht16_path). Typical data
//           (BF16 chunks spanning <= 12 binades) always takes it.
//   kInt64: the same butterfly on exact int64 fixed-point values (units of the chunk's smallest
//           significant bit) when the partial sums fit in 63 bits, then one RN to FP32.
//   kWide:  otherwise (a chunk spanning more than ~35 binades, e.g. 1e-30 next to 1): the same
//           butterfly on exact 288-bit two's complement integers with bit k worth 2^(k-149) (covers
//           2^-149 .. 2^138 > 16 * FLT_MAX), then one RN to FP32 per output.
// The two integer paths round with rht_round_fp32 (round to nearest even, subnormal results and
// overflow to Inf included) and give an exactly zero output the sign IEEE arithmetic gives it in the
// butterfly (negzero_stage). All three give RN_fp32(exact sum * 0.25), which is what the former
// double-precision implementation gave wherever its double sum was exact (every chunk of BF16 values
// spanning < ~41 binades; tests/numerics/test_hadamard.cpp keeps it as a reference).
// Non-finite inputs (path kNonFinite): a NaN anywhere makes every output NaN; otherwise output j is the
// sum of only its infinite signed terms (+Inf and -Inf together give NaN), as IEEE addition in the
// butterfly gives. Then RN to BF16 (every NaN becomes BF16 0x7FFF, CUDA's canonical NaN).
#include <cstdint>

#include "numerics/bf16.h"
#include "numerics/hd.h"

namespace pl::num {

// TE's fixed sign vector (nvfp4_tensor.py get_wgrad_sign_vector):
// s = [+1,+1,+1,-1,+1,-1,-1,-1,-1,-1,-1,+1,-1,+1,-1,-1], bit i set where s_i = -1.
constexpr uint16_t kRhtSignMask = 0xD7E8;

// H16[i][j] * s_i as +-1.
PL_HD int rht_sign(int i, int j, uint16_t sign_mask) {
  int p = i & j;
  p ^= p >> 2;
  p ^= p >> 1;
  const int neg = (p & 1) ^ ((sign_mask >> i) & 1);
  return neg ? -1 : 1;
}

namespace rht_detail {

// Bit counts of nonzero words (host: GCC/Clang builtins, as this header is also compiled as CUDA C++17).
PL_HD int ctz32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(x)) - 1;
#else
  return __builtin_ctz(x);
#endif
}
PL_HD int clz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(x));
#else
  return __builtin_clzll(x);
#endif
}

// A finite nonzero float |x| as sig * 2^(pos - 149): sig the 24-bit significand (hidden bit included
// for normals), pos = max(biased exponent, 1) - 1, so pos >= 0 and subnormals need no special case.
struct SigPos {
  uint32_t sig;
  int pos;
};
PL_HD SigPos split(uint32_t abs_bits) {
  const uint32_t e = abs_bits >> 23;
  if (e == 0) return {abs_bits, 0};
  return {(abs_bits & 0x7FFFFFu) | 0x800000u, static_cast<int>(e) - 1};
}

// min over the nonzero inputs of the exponent of the lowest set bit (lsb_min of rht16_path); 1000 if none.
PL_HD int lsb_min16(const float in[16]) {
  int lsb_min = 1000;
  for (int i = 0; i < 16; ++i) {
    const uint32_t a = float_bits(in[i]) & 0x7FFFFFFFu;
    if (a == 0) continue;
    const auto [sig, pos] = split(a);
    const int l = pos - 149 + ctz32(sig);
    lsb_min = l < lsb_min ? l : lsb_min;
  }
  return lsb_min;
}

constexpr int kWideWords = 9;  // 288 bits, bit k worth 2^(k-149)

// acc += sig * 2^pos (sig < 2^24, 0 <= pos < 254): at most two words plus a carry.
PL_HD void wide_add(uint32_t acc[kWideWords], uint32_t sig, int pos) {
  int w = pos >> 5;
  uint64_t v = static_cast<uint64_t>(sig) << (pos & 31);  // < 2^55
  while (v != 0 && w < kWideWords) {
    const uint64_t s = static_cast<uint64_t>(acc[w]) + (v & 0xFFFFFFFFu);
    acc[w] = static_cast<uint32_t>(s);
    v = (v >> 32) + (s >> 32);
    ++w;
  }
}

// acc = -acc in two's complement: ~acc + 1.
PL_HD void wide_negate(uint32_t acc[kWideWords]) {
  uint32_t carry = 1;
  for (int w = 0; w < kWideWords; ++w) {
    const uint64_t s = static_cast<uint64_t>(~acc[w]) + carry;
    acc[w] = static_cast<uint32_t>(s);
    carry = static_cast<uint32_t>(s >> 32);
  }
}

}  // namespace rht_detail

// RN_fp32(mag * 2^scale_exp), negated when `neg`: round to nearest, ties to even, with subnormal results
// (quantum 2^-149) and overflow to Inf. `mag` may carry a sticky bit in bit 0 as long as bit 0 lies below
// the rounding position (callers guarantee it). mag == 0 gives +0.
PL_HD float rht_round_fp32(uint64_t mag, int scale_exp, bool neg) {
  if (mag == 0) return 0.0f;
  const int top = 63 - rht_detail::clz64(mag);   // mag in [2^top, 2^(top+1))
  int q = top + scale_exp - 23;                  // exponent of the result's last significand bit
  if (q < -149) q = -149;                        // subnormal range: fixed quantum 2^-149
  const int shift = q - scale_exp;               // low bits of mag below the quantum
  uint64_t m;                                    // the rounded significand, <= 2^24
  if (shift <= 0) {
    m = mag << -shift;  // exact: at most 24 significant bits (top - shift <= 23)
  } else if (shift >= 64) {
    m = (shift == 64 && mag > (uint64_t{1} << 63)) ? 1u : 0u;  // below half a quantum (or a tie) -> 0
  } else {
    m = mag >> shift;
    const uint64_t rem = mag & ((uint64_t{1} << shift) - 1u);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (m & 1u) != 0)) ++m;
  }
  const uint32_t sign = neg ? 0x80000000u : 0u;
  if (m == 0) return bits_float(sign);  // underflow to a zero of the value's sign
  // m in [2^23, 2^24] for normals (the hidden bit adds one to the exponent field, and m == 2^24 after a
  // rounding carry adds two: the next binade), m < 2^23 only for subnormals (q == -149, field 0).
  if (q + 149 >= 255) return bits_float(sign | 0x7F800000u);
  const uint32_t bits = (static_cast<uint32_t>(q + 149) << 23) + static_cast<uint32_t>(m);
  return bits_float(sign | (bits >= 0x7F800000u ? 0x7F800000u : bits));
}

enum class RhtPath : int { kFp32 = 0, kInt64 = 1, kWide = 2, kNonFinite = 3 };

// Which path computes this chunk exactly (see the top of the file). For the nonzero finite inputs x_i
// let e_i = floor(log2|x_i|), l_i the exponent of the lowest set bit of x_i's significand (x_i is an odd
// integer times 2^l_i), e_max = max e_i, lsb_min = min l_i.
// Proof that the FP32 butterfly is exact when W := e_max + 5 - lsb_min <= 24 and e_max + 5 <= 128:
// every value the butterfly forms (the signed inputs, and after stage k the sums of 2^k of them with
// signs +-1) is a signed sum of at most 16 inputs. Each |x_i| < 2^(e_max+1), so |partial| <
// 16 * 2^(e_max+1) = 2^(e_max+5); each x_i is an integer multiple of 2^lsb_min, so every partial is an
// integer N times 2^lsb_min with |N| < 2^(e_max+5-lsb_min) <= 2^24. An integer of at most 24 bits times
// 2^lsb_min is an FP32 number (24-bit significand; lsb_min >= -149 as the inputs are floats, and the
// magnitude is below 2^(e_max+5) <= 2^128, so no overflow). Hence every FP32 addition and subtraction
// in the butterfly returns its exact result, the final sums are exact, and the one multiply by 0.25f
// is a single correctly rounded operation: RN_fp32(exact * 0.25) (exact unless it lands among the
// subnormals, where it rounds once, as required). Signed zeros come out as the exact double butterfly
// made them, since every operation on both is exact and x -> 0.25 x preserves signs.
// For BF16 inputs (8 significant bits, l_i >= e_i - 7) the condition holds whenever the chunk spans
// e_max - e_min <= 12 binades. Under --fp32-reference (full 24-bit significands) it rarely holds and
// the int64 path serves: W <= 63 keeps every |N| < 2^63 by the same argument.
// The FP32 test is cheap (the common case): one max over the magnitudes gives e_max (and flags any
// Inf/NaN: their bit patterns are the largest), then each input only has to be a multiple of
// 2^(e_max - 19), i.e. its significand's bits below that position must be zero (W <= 24 <=> lsb_min >=
// e_max - 19). Only chunks that fail it compute lsb_min to choose between the integer paths.
PL_HD RhtPath rht16_path(const float in[16]) {
  uint32_t amax = 0;
  for (int i = 0; i < 16; ++i) {
    const uint32_t a = float_bits(in[i]) & 0x7FFFFFFFu;
    amax = a > amax ? a : amax;
  }
  if (amax >= 0x7F800000u) return RhtPath::kNonFinite;
  if (amax == 0) return RhtPath::kFp32;  // all zeros: exact
  const auto [amax_sig, amax_pos] = rht_detail::split(amax);
  const int e_max = amax_pos - 149 + 63 - rht_detail::clz64(amax_sig);
  if (e_max + 5 <= 128) {
    const int need = e_max - 19;  // every input must be a multiple of 2^need
    uint32_t low = 0;
    for (int i = 0; i < 16; ++i) {
      const uint32_t a = float_bits(in[i]) & 0x7FFFFFFFu;
      const auto [sig, pos] = rht_detail::split(a);  // a == 0: sig == 0, nothing to test
      const int k = need - (pos - 149);           // bits of sig that must be zero
      const uint32_t mask = k <= 0 ? 0u : (k >= 32 ? 0xFFFFFFFFu : (1u << k) - 1u);
      low |= sig & mask;
    }
    if (low == 0) return RhtPath::kFp32;
  }
  return e_max + 5 - rht_detail::lsb_min16(in) <= 63 ? RhtPath::kInt64 : RhtPath::kWide;
}

// True when the chunk takes the FP32 butterfly (finite, and the exactness bound above holds).
PL_HD bool rht16_is_fp32_exact(const float in[16]) { return rht16_path(in) == RhtPath::kFp32; }

namespace rht_detail {

// One stage of the butterfly (stages len = 1, 2, 4, 8: 64 additions instead of 256); together they form
// the same sums Σ_i H[i][j]·v_i as the direct definition.
template <class T>
PL_HD void butterfly_stage(T v[16], int len) {
  for (int i = 0; i < 16; i += 2 * len)
    for (int k = i; k < i + len; ++k) {
      const T a = v[k], b = v[k + len];
      v[k] = a + b;
      v[k + len] = a - b;
    }
}

// Signs of zero in the integer paths. The FP32 butterfly and the former double one are exact, so each
// of their values is exact and its sign of zero follows IEEE's rule for an exact zero result: a + b is
// -0 only when a and b are both -0 (a + (-a) != 0 gives +0), a - b only when a is -0 and b is +0. The
// integer paths run the same butterfly and carry the same rule in a bit mask (bit k: v[k] is -0, read
// only where v[k] == 0), so an output that is exactly zero gets the sign the double code gave it.
// `zero` has bit k set where v[k] == 0, taken before the stage.
PL_HD uint32_t negzero_stage(uint32_t nz, uint32_t zero, int len) {
  uint32_t out = 0;
  for (int i = 0; i < 16; i += 2 * len)
    for (int k = i; k < i + len; ++k) {
      const uint32_t both = (zero >> k) & (zero >> (k + len)) & 1u;
      const uint32_t a = (nz >> k) & 1u, b = (nz >> (k + len)) & 1u;
      out |= (both & a & b) << k;                // a + b
      out |= (both & a & (b ^ 1u)) << (k + len);  // a - b
    }
  return out;
}

// Sign tests below are written as ((u >> 31) ^ bit) != 0: GCC 12.2 at -O1 (tree-forwprop) miscompiles
// the equivalent ((u >> 31) != 0) != (((sign_mask >> i) & 1u) != 0) in these loops (seen here: the
// negation of a negative input was skipped).

// -0 where the signed input s_i * in_i is a negative zero.
PL_HD uint32_t input_negzero(const float in[16], uint16_t sign_mask) {
  uint32_t nz = 0;
  for (int i = 0; i < 16; ++i) {
    const uint32_t u = float_bits(in[i]);
    if ((u & 0x7FFFFFFFu) == 0 && ((u >> 31) ^ ((sign_mask >> i) & 1u)) != 0) nz |= 1u << i;
  }
  return nz;
}

PL_HD void rht16_fp32(const float in[16], float out[16], uint16_t sign_mask) {
  float v[16];
  for (int i = 0; i < 16; ++i) v[i] = ((sign_mask >> i) & 1u) ? -in[i] : in[i];
  for (int len = 1; len < 16; len <<= 1) butterfly_stage(v, len);
  for (int j = 0; j < 16; ++j) out[j] = round_bf16(v[j] * 0.25f);
}

// Exact: every value is an integer multiple of 2^lsb_min below 2^63 (rht16_path).
PL_HD void rht16_int64(const float in[16], float out[16], uint16_t sign_mask) {
  const int lsb_min = lsb_min16(in);
  uint32_t nz = input_negzero(in, sign_mask);
  int64_t v[16];
  for (int i = 0; i < 16; ++i) {
    const uint32_t u = float_bits(in[i]);
    const uint32_t a = u & 0x7FFFFFFFu;
    uint64_t mag = 0;
    if (a != 0) {
      const auto [sig, pos] = split(a);
      const int sh = pos - 149 - lsb_min;  // >= -ctz(sig): a right shift drops only zero bits
      mag = sh >= 0 ? static_cast<uint64_t>(sig) << sh : static_cast<uint64_t>(sig >> -sh);
    }
    const bool neg = ((u >> 31) ^ ((sign_mask >> i) & 1u)) != 0;
    v[i] = neg ? -static_cast<int64_t>(mag) : static_cast<int64_t>(mag);
  }
  for (int len = 1; len < 16; len <<= 1) {
    uint32_t zero = 0;
    for (int k = 0; k < 16; ++k) zero |= (v[k] == 0 ? 1u : 0u) << k;
    nz = negzero_stage(nz, zero, len);
    butterfly_stage(v, len);
  }
  for (int j = 0; j < 16; ++j) {
    const bool neg = v[j] < 0;
    const uint64_t mag = neg ? uint64_t{0} - static_cast<uint64_t>(v[j]) : static_cast<uint64_t>(v[j]);
    const float f = mag == 0 ? bits_float(((nz >> j) & 1u) << 31) : rht_round_fp32(mag, lsb_min - 2, neg);
    out[j] = round_bf16(f);
  }
}

// Exact for any finite chunk: the butterfly on 288-bit two's complement integers (bit k worth
// 2^(k-149); every |partial| < 16 * 2^128 = 2^132 needs bits up to 281 with the sign), then per
// output its leading 64 bits (with a sticky bit for what lies below) rounded once.
PL_HD void rht16_wide(const float in[16], float out[16], uint16_t sign_mask) {
  constexpr int W = kWideWords;
  uint32_t v[16][W];
  uint32_t nz = input_negzero(in, sign_mask);
  for (int i = 0; i < 16; ++i) {
    for (int w = 0; w < W; ++w) v[i][w] = 0;
    const uint32_t u = float_bits(in[i]);
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a == 0) continue;
    const auto [sig, pos] = split(a);
    wide_add(v[i], sig, pos);
    if (((u >> 31) ^ ((sign_mask >> i) & 1u)) != 0) wide_negate(v[i]);
  }
  for (int len = 1; len < 16; len <<= 1) {
    uint32_t zero = 0;
    for (int k = 0; k < 16; ++k) {
      uint32_t any = 0;
      for (int w = 0; w < W; ++w) any |= v[k][w];
      zero |= (any == 0 ? 1u : 0u) << k;
    }
    nz = negzero_stage(nz, zero, len);
    for (int i = 0; i < 16; i += 2 * len)
      for (int k = i; k < i + len; ++k) {
        uint32_t carry = 0, borrow = 0;
        for (int w = 0; w < W; ++w) {
          const uint32_t a = v[k][w], b = v[k + len][w];
          const uint64_t s = static_cast<uint64_t>(a) + b + carry;
          const uint64_t d = static_cast<uint64_t>(a) - b - borrow;
          v[k][w] = static_cast<uint32_t>(s);
          v[k + len][w] = static_cast<uint32_t>(d);
          carry = static_cast<uint32_t>(s >> 32);
          borrow = static_cast<uint32_t>(d >> 63);
        }
      }
  }
  for (int j = 0; j < 16; ++j) {
    uint32_t* d = v[j];
    const bool neg = (d[W - 1] >> 31) != 0;
    if (neg) wide_negate(d);
    int t = W - 1;
    while (t >= 0 && d[t] == 0) --t;
    float f;
    if (t < 0) {
      f = bits_float(((nz >> j) & 1u) << 31);
    } else if (t == 0) {
      f = rht_round_fp32(d[0], -151, neg);  // bit 0 worth 2^-149, times 0.25
    } else {
      // Leading word nonzero: the 64-bit window holds >= 33 significant bits, so its bit 0 lies below
      // the rounding position and may carry the sticky bit.
      uint64_t mag = (static_cast<uint64_t>(d[t]) << 32) | d[t - 1];
      uint32_t sticky = 0;
      for (int w = 0; w < t - 1; ++w) sticky |= d[w];
      if (sticky != 0) mag |= 1u;
      f = rht_round_fp32(mag, 32 * (t - 1) - 151, neg);
    }
    out[j] = round_bf16(f);  // after the butterfly: out may alias in
  }
}

// NaN anywhere -> NaN everywhere; else output j = the sum of its infinite signed terms.
PL_HD void rht16_nonfinite(const float in[16], float out[16], uint16_t sign_mask) {
  bool nan = false;
  for (int i = 0; i < 16; ++i) nan = nan || (float_bits(in[i]) & 0x7FFFFFFFu) > 0x7F800000u;
  float res[16];
  for (int j = 0; j < 16; ++j) {
    bool pinf = false, ninf = false;
    for (int i = 0; i < 16; ++i) {
      const uint32_t u = float_bits(in[i]);
      if ((u & 0x7FFFFFFFu) != 0x7F800000u) continue;
      const bool neg = ((u >> 31) ^ (rht_sign(i, j, sign_mask) < 0 ? 1u : 0u)) != 0;
      (neg ? ninf : pinf) = true;
    }
    res[j] = bits_float(nan || (pinf && ninf) ? 0x7FC00000u : (pinf ? 0x7F800000u : 0xFF800000u));
  }
  for (int j = 0; j < 16; ++j) out[j] = round_bf16(res[j]);
}

}  // namespace rht_detail

// ---- the fast path of the GPU's quantizers: two FP32 lanes, no integer paths -------------------------
// rht16_fast gives rht16's bits for every chunk it accepts and returns false (out unspecified) for the
// rest, which the caller sends to rht16 (on the GPU: a separate fallback kernel, so the integer paths and
// their 640-byte stack stay out of the hot kernels). No FP64, no integer wide arithmetic, no stack.
// Method (an error-free split, in the spirit of TwoSum: every FP32 operation below is exact, except the
// one final addition, which is then the single correct rounding of the exact sum):
//   e_max = floor(log2 max|x_i|); C = 1.5 * 2^(e_max+4), whose ulp is g = 2^(e_max-19).
//   L_i = x_i - ((x_i + C) - C): (x_i + C) stays in C's binade (|x_i| < 2^(e_max+1)), so (x_i + C) - C
//         is x_i rounded to the grid g (exact subtraction) and L_i its residual, |L_i| <= min(|x_i|, g/2):
//         an integer multiple of x_i's last significand bit below 2^24 of them, so exact in FP32.
//   H_i = x_i - L_i: the grid value itself (exact; and H_i = x_i, signed zeros included, when L_i = 0).
//   H lane: the butterfly on s_i*H_i is exact by rht16_path's argument with lsb_min >= e_max - 19
//         (multiples of g below 2^(e_max+5): integers N <= 2^24 times g).
//   L lane: the butterfly on s_i*L_i is exact when every L_i is a multiple of 2^(e_max-39) (checked with
//         C2 = 1.5 * 2^(e_max-16), whose ulp that is: (L_i + C2) - C2 == L_i): partials are multiples of
//         2^(e_max-39) of magnitude <= 16 * 2^(e_max-20), i.e. N <= 2^23 of them.
//   out_j = RN_bf16(RN(SH_j + SL_j) * 0.25f): the one rounded addition is RN_fp32 of the exact sum; the
//         multiply by 0.25 is exact when |RN(S)| >= 2^-120 (then S/4 and RN(S)/4 are normal and
//         RN(S/4) = RN(S)/4). Where every L_i is zero the H lane is rht16_fp32's butterfly verbatim.
// Accepted (tests/numerics/test_hadamard.cpp computes the same predicate independently and compares): finite inputs, and either
// all zero, or e_max in [-100, 120] (constants and partials stay normal and finite) with every x_i a
// multiple of 2^(e_max-39) and, when some L_i != 0, every |RN(SH_j + SL_j)| >= 2^-120 (an exact zero
// sum there would need IEEE's sign-of-zero rule across two lanes: sent to the exact path instead).
// For BF16 inputs (lowest bit >= e_i - 7) that is every chunk whose nonzero values span <= 32 binades,
// against <= 12 for rht16_path's FP32 butterfly alone. Cost per element: 3 adds of the split, 2 of the
// check, 4 (or 8) of the butterfly(s), 1 add, 1 multiply and the BF16 rounding.
namespace rht_detail {

// Splits v[] in place into the signed H lane inputs s_i*H_i (v) and the L lane inputs s_i*L_i (l).
// Returns 0 when the chunk is rejected (v partly overwritten), 1 when the H lane alone is exact (every
// L_i zero), 2 when both lanes are needed. *absmax = max |v_i| of the input (meaningful when accepted).
PL_HD int fast_split(float v[16], float l[16], uint16_t sign_mask, float* absmax) {
  uint32_t amax = 0;
  for (int i = 0; i < 16; ++i) {
    const uint32_t a = float_bits(v[i]) & 0x7FFFFFFFu;
    amax = a > amax ? a : amax;
  }
  *absmax = bits_float(amax);
  if (amax >= 0x7F800000u) return 0;  // Inf or NaN: the exact path
  if (amax == 0) {  // all zeros: the FP32 butterfly, signs of zero as rht16_fp32 gives them
    for (int i = 0; i < 16; ++i) {
      v[i] = ((sign_mask >> i) & 1u) ? -v[i] : v[i];
      l[i] = 0.0f;
    }
    return 1;
  }
  const int e_max = static_cast<int>(amax >> 23) - 127;  // amax is normal here (e_max >= -100 below)
  if (e_max < -100 || e_max > 120) return 0;
  const float c = bits_float((static_cast<uint32_t>(e_max + 127 + 4) << 23) | 0x400000u);
  const float c2 = bits_float((static_cast<uint32_t>(e_max + 127 - 16) << 23) | 0x400000u);
  bool grid_ok = true, two = false;
  for (int i = 0; i < 16; ++i) {
    const float x = v[i];
    const float lo = x - ((x + c) - c);
    const float hi = lo == 0.0f ? x : x - lo;  // x itself keeps a -0 input's sign
    grid_ok = grid_ok && ((lo + c2) - c2) == lo;
    two = two || lo != 0.0f;
    const bool neg = ((sign_mask >> i) & 1u) != 0;
    v[i] = neg ? -hi : hi;
    l[i] = neg ? -lo : lo;
  }
  return grid_ok ? (two ? 2 : 1) : 0;
}

}  // namespace rht_detail

// In place: true and v[j] = RN_fp32(exact sum_j * 0.25) (rht16's output before its BF16 rounding) when
// the chunk is accepted, with *in_absmax = max |input| (the plain amax, for free); false (v clobbered)
// sends it to rht16.
PL_HD bool rht16_fast_fp32(float v[16], uint16_t sign_mask, float* in_absmax) {
  float l[16];
  const int lanes = rht_detail::fast_split(v, l, sign_mask, in_absmax);
  if (lanes == 0) return false;
  for (int len = 1; len < 16; len <<= 1) rht_detail::butterfly_stage(v, len);
  if (lanes == 1) {
    for (int j = 0; j < 16; ++j) v[j] = v[j] * 0.25f;
    return true;
  }
  for (int len = 1; len < 16; len <<= 1) rht_detail::butterfly_stage(l, len);
  bool ok = true;
  for (int j = 0; j < 16; ++j) {
    const float s = v[j] + l[j];  // the one rounding: RN_fp32 of the exact sum
    ok = ok && (float_bits(s) & 0x7FFFFFFFu) >= 0x03800000u;  // |s| >= 2^-120
    v[j] = s * 0.25f;
  }
  return ok;
}

// True (and out = rht16(in); out may alias in) when the chunk is accepted; false sends it to rht16.
PL_HD bool rht16_fast(const float in[16], float out[16], uint16_t sign_mask) {
  for (int i = 0; i < 16; ++i) out[i] = in[i];
  float absmax;
  if (!rht16_fast_fp32(out, sign_mask, &absmax)) return false;
  for (int j = 0; j < 16; ++j) out[j] = round_bf16(out[j]);
  return true;
}

// out may alias in.
PL_HD void rht16(const float in[16], float out[16], uint16_t sign_mask) {
  switch (rht16_path(in)) {
    case RhtPath::kFp32: return rht_detail::rht16_fp32(in, out, sign_mask);
    case RhtPath::kInt64: return rht_detail::rht16_int64(in, out, sign_mask);
    case RhtPath::kWide: return rht_detail::rht16_wide(in, out, sign_mask);
    case RhtPath::kNonFinite: return rht_detail::rht16_nonfinite(in, out, sign_mask);
  }
}

}  // namespace pl::num
