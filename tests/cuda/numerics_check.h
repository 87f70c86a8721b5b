#pragma once
// Device launches of the shared numerics, for the GPU conformance tests. All pointers are device
// pointers; each call synchronizes and throws with the kernel name and the CUDA error string.
#include <cstdint>

#include "numerics/adamw.h"
#include "numerics/bf16.h"
#include "numerics/fp4.h"
#include "numerics/fp8.h"
#include "numerics/hadamard.h"
#include "numerics/hd.h"
#include "numerics/nvfp4.h"
#include "numerics/philox.h"
#include "numerics/swizzle.h"

namespace pl::cuda {

void bf16_round_on_device(const float* in, uint16_t* bits, float* rounded, int64_t n);
void adamw_on_device(float* master, float* m, float* v, const float* grad, int64_t n,
                     const num::AdamWHyper& h);

// Every NVFP4/FP8/MXFP8 numerics function (lib/numerics/{fp8,fp4,philox,nvfp4,hadamard,swizzle}.h)
// once per item, for bit-exact host/device comparison: quant_numerics_on_device runs item i in thread
// i (in: 16*n floats, out: kQuantCheckOutBytes*n bytes, device pointers); a host loop over
// quant_numerics_item gives the expected bytes. Layout of one item's output (floats little endian):
//   0 e4m3(x0)  1 e5m2(x0)  2 ue8m0_rp(x0)  3 e2m1(x0)  4 e2m1_sr(x0, i)  5 mxfp8_block_scale(x0)
//   6 pack(o3, o4)  7 sr_random_byte(seed, 7, 3, i)
//   8 f e4m3_to_float(o0)+e5m2_to_float(o1)  12 f ue8m0_to_float(o2)*mxfp8_element_scale(o5)
//   16 f e2m1_to_float(o3)  20 f fp8_current_scale(x1, 448)  24 f S_enc(x2)  28 f S_dec
//   32 f nvfp4_block_encode(block_scale(x3))  36 f dequant_factor(scale, x2)  40 f gemm_alpha(x2, x3)
//   44 nvfp4_block_scale(x3, S_enc)  45 nvfp4_encode(x4, S_enc)  46 nvfp4_encode_sr(x4, S_enc, 37 i)
//   47 swizzle/padding byte  48 RN block scale + 16 codes  65 SR block scale + 16 codes
//   82 16 f rht16(x, 0xD7E8)  146 4 x u32 philox4x32_10({i,0,0,0}, seed)
constexpr int64_t kQuantCheckOutBytes = 162;

PL_HD void quant_check_put_f32(uint8_t* p, float f) {
  const uint32_t u = num::float_bits(f);
  for (int k = 0; k < 4; ++k) p[k] = static_cast<uint8_t>(u >> (8 * k));
}

PL_HD void quant_numerics_item(const float* x, int64_t i, uint64_t seed, uint8_t* o) {
  o[0] = num::float_to_e4m3(x[0]);
  o[1] = num::float_to_e5m2(x[0]);
  o[2] = num::float_to_ue8m0_rp(x[0]);
  o[3] = num::float_to_e2m1(x[0]);
  o[4] = num::float_to_e2m1_sr(x[0], static_cast<uint8_t>(i));
  o[5] = num::mxfp8_block_scale(x[0]);
  o[6] = num::pack_e2m1_pair(o[3], o[4]);
  o[7] = num::sr_random_byte(seed, 7u, 3u, static_cast<uint64_t>(i));
  quant_check_put_f32(o + 8, num::e4m3_to_float(o[0]) + num::e5m2_to_float(o[1]));
  quant_check_put_f32(o + 12, num::ue8m0_to_float(o[2]) * num::mxfp8_element_scale(o[5]));
  quant_check_put_f32(o + 16, num::e2m1_to_float(o[3]));
  quant_check_put_f32(o + 20, num::fp8_current_scale(x[1], num::kE4M3Max));
  const float s_enc = num::nvfp4_global_encode_scale(x[2]);
  const float s_dec = num::nvfp4_global_decode_scale(s_enc);
  quant_check_put_f32(o + 24, s_enc);
  quant_check_put_f32(o + 28, s_dec);
  const uint8_t sc = num::nvfp4_block_scale(x[3], s_enc);
  quant_check_put_f32(o + 32, num::nvfp4_block_encode(sc, s_dec));
  quant_check_put_f32(o + 36, num::nvfp4_dequant_factor(sc, x[2]));
  quant_check_put_f32(o + 40, num::nvfp4_gemm_alpha(x[2], x[3]));
  o[44] = sc;
  o[45] = num::nvfp4_encode(x[4], s_enc);
  o[46] = num::nvfp4_encode_sr(x[4], s_enc, static_cast<uint8_t>(i * 37));
  o[47] = static_cast<uint8_t>(num::swizzled_scale_offset(i, i % 7, num::padded_scale_cols(7)) +
                               num::padded_scale_rows(i));
  const float s_blk = num::nvfp4_global_encode_scale(num::nvfp4_abs_max(x, 16));
  num::nvfp4_quantize_block16(x, s_blk, o + 48, o + 49);
  uint8_t rb[16];
  num::sr_random_bytes16(seed, 1u, 2u, static_cast<uint64_t>(i), rb);
  num::nvfp4_quantize_block16_sr(x, s_blk, rb, o + 65, o + 66);
  float y[16];
  num::rht16(x, y, num::kRhtSignMask);
  for (int k = 0; k < 16; ++k) quant_check_put_f32(o + 82 + 4 * k, y[k]);
  const uint32_t ctr[4] = {static_cast<uint32_t>(i), 0u, 0u, 0u};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint32_t r[4];
  num::philox4x32_10(ctr, key, r);
  for (int k = 0; k < 4; ++k) quant_check_put_f32(o + 146 + 4 * k, num::bits_float(r[k]));
}

void quant_numerics_on_device(const float* in, uint8_t* out, int64_t n, uint64_t seed);

// ---- the hardware encodes against the shared numerics (backend/cuda/quantize_common.cuh) -----------
// Every float bit pattern u in [begin, end) is encoded by the quantizers' conversion (qk::cvt_fp8x2 /
// qk::cvt_e2m1x2: the cvt instruction where this build's code for the running GPU has it, NaN set in
// software) and by num::float_to_e4m3 / e5m2 / e2m1, as the low element of a pair whose high element is
// u ^ kConversionPairMask (a bijection, so every pattern is also checked in the high byte / nibble).
enum class ConversionFormat : int { E4M3 = 0, E5M2 = 1, E2M1 = 2 };
constexpr uint32_t kConversionPairMask = 0xA5A5A5A5u;
constexpr int kConversionFirstMismatches = 8;

struct ConversionCheck {
  unsigned long long mismatches = 0;       // the kernels' conversion vs the numerics (pairs that differ)
  unsigned long long raw_mismatches = 0;   // the bare instruction (no NaN fix) vs the numerics
  unsigned long long raw_non_nan_mismatches = 0;  // of those, pairs with no NaN element
  int hw_paths = 0;    // qk::hw_cvt_paths() of the code that ran: bit 0 FP8 by cvt, bit 1 E2M1 by cvt
  int cuda_arch = 0;   // __CUDA_ARCH__ of the code that ran
  int recorded = 0;    // first mismatches of the kernels' conversion (at most kConversionFirstMismatches)
  uint32_t input[kConversionFirstMismatches] = {};
  uint32_t got[kConversionFirstMismatches] = {};   // the pair's code bits (low element in the low bits)
  uint32_t want[kConversionFirstMismatches] = {};
};

ConversionCheck conversion_check_on_device(ConversionFormat format, uint64_t begin, uint64_t end);

}  // namespace pl::cuda
