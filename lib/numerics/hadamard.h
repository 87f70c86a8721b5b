#pragma once
// The 16-point random Hadamard transform of the NVFP4 recipe (SPEC-NVFP4 §3): a 16-element chunk c
// (a row vector, BF16 values) becomes c' = c · R with R = diag(s) · H16 · 0.25,
// H16[i][j] = (-1)^popcount(i & j), s_i = -1 where bit i of the sign mask is set.
// Output model: out_j = RN_bf16(RN_fp32(exact sum_i 0.25 * s_i * H[i][j] * in_i)), i.e. the tensor-core
// MMA is modelled as the correctly rounded FP32 sum, then cvt.rn.bf16.f32 (TE
// hadamard_transform_utils.cuh, hadamard_transform_cast_fusion.cu). Do not round the sum straight to
// BF16 (double rounding differs in rare cases, §3).
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

// out may alias in. The sum is accumulated in double: every term 0.25 * (+-in_i) is exact in double
// (a BF16 value has 8 significant bits, a float 24), and the 16-term sum is exact as long as the
// terms' exponents span less than about 53 - 24 - 4 = 25 binades for full-float inputs, or
// 53 - 8 - 4 = 41 binades for BF16 inputs (the case of the recipe); beyond that the double sum is
// rounded once before the float rounding, which can differ from the exact model only in double-rounding
// corner cases of chunks mixing values ~2^41 apart (the tensor cores' own accumulation order is
// unspecified there too, §3 "UNCERTAIN"). Then RN to FP32 (a plain cast) and RN to BF16.
// NaN/Inf inputs propagate (NaN -> BF16 0x7FFF's value).
PL_HD void rht16(const float in[16], float out[16], uint16_t sign_mask) {
  // Fast Walsh-Hadamard transform (4 butterfly stages) on 0.25*s_i*in_i in double: it forms the same
  // sums Σ_i H[i][j]·v_i as the direct definition, and every partial sum is exact in the regime
  // described above, so the result is the same bits (checked against an exact integer reference in
  // tests/numerics/test_hadamard.cpp). 64 additions instead of 256.
  double v[16];
  for (int i = 0; i < 16; ++i) {
    const double t = 0.25 * static_cast<double>(in[i]);
    v[i] = ((sign_mask >> i) & 1u) ? -t : t;
  }
  for (int len = 1; len < 16; len <<= 1)
    for (int i = 0; i < 16; i += 2 * len)
      for (int k = i; k < i + len; ++k) {
        const double a = v[k], b = v[k + len];
        v[k] = a + b;
        v[k + len] = a - b;
      }
  for (int j = 0; j < 16; ++j) out[j] = round_bf16(static_cast<float>(v[j]));
}

}  // namespace pl::num
