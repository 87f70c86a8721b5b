#pragma once
// Device helpers shared by the quantization kernels (quantize.cu, dequantize.cu, quant_stats.cu,
// quantized_gemm.cu): element loads
// from BF16 (as uint16 bits) or F32 storage, the 64x64 shared-memory tile every copy is made from,
// NaN-ignoring max reductions and vectorised byte stores. No numerics here: the per-element and
// per-block math is the shared lib/numerics/ code, called by the kernels.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/quantize.h"
#include "core/tensor.h"
#include "numerics/fp4.h"
#include "numerics/fp8.h"
#include "numerics/nvfp4.h"
#include "numerics/swizzle.h"
#include "numerics/bf16.h"

namespace pl::cuda::qk {

// A thread block makes the codes of one kTile x kTile tile of x, for both copies: the rowwise copy
// reads the tile's rows, the columnwise copy its columns (the transpose goes through shared memory,
// so global reads and writes stay coalesced). kTileLd pads the rows against bank conflicts.
constexpr int kTile = 64;
constexpr int kTileLd = kTile + 1;
constexpr int kThreads = 256;

// BF16 storage is read as its 16-bit pattern and widened exactly (num::bf16_bits_to_float).
__device__ __forceinline__ float load_elem(const uint16_t* x, int64_t i) { return num::bf16_bits_to_float(x[i]); }
__device__ __forceinline__ float load_elem(const float* x, int64_t i) { return x[i]; }

__device__ __forceinline__ bool aligned_to(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// m and a are non-negative and never NaN: the larger one (fmaxf without the NaN case).
__device__ __forceinline__ float max_nonneg(float m, float a) { return a > m ? a : m; }

// fmaxf(m, |v|) for a non-NaN m: a NaN v is ignored, Inf kept (the CPU reference's max_abs).
__device__ __forceinline__ float max_abs(float m, float v) {
  const float a = fabsf(v);
  return a > m ? a : m;
}

// 16 bytes of T at p (16-byte aligned) as floats: 8 BF16 values or 4 F32 values.
template <typename T>
__device__ __forceinline__ void load_vec16(const T* p, float* out) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  if constexpr (sizeof(T) == 2) {
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = num::bf16_bits_to_float(static_cast<uint16_t>(w[k] & 0xFFFFu));
      out[2 * k + 1] = num::bf16_bits_to_float(static_cast<uint16_t>(w[k] >> 16));
    }
  } else {
    for (int k = 0; k < 4; ++k) out[k] = num::bits_float(w[k]);
  }
}

// s[rr][cc] = x[r0 + rr][c0 + cc] as float (0 outside x[R, C]). Called by all kThreads threads;
// the caller synchronises before reading s.
template <typename T>
__device__ void load_tile(float (*s)[kTileLd], const T* x, int64_t R, int64_t C, int64_t r0, int64_t c0) {
  constexpr int kV = 16 / static_cast<int>(sizeof(T));
  constexpr int kVecPerRow = kTile / kV;
  const bool full = r0 + kTile <= R && c0 + kTile <= C;
  if (full && C % kV == 0 && aligned_to(x, 16)) {
    for (int i = threadIdx.x; i < kTile * kVecPerRow; i += blockDim.x) {
      const int rr = i / kVecPerRow, cv = i % kVecPerRow;
      float v[kV];
      load_vec16(x + (r0 + rr) * C + c0 + cv * kV, v);
      for (int k = 0; k < kV; ++k) s[rr][cv * kV + k] = v[k];
    }
  } else {
    for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
      const int rr = i / kTile, cc = i % kTile;
      const int64_t r = r0 + rr, c = c0 + cc;
      s[rr][cc] = (r < R && c < C) ? load_elem(x, r * C + c) : 0.0f;
    }
  }
}

// Max of non-negative, non-NaN values over the thread block (blockDim.x a multiple of 32, at most
// 1024); every thread must call it; the result is valid in thread 0.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_max[32];
  for (int off = 16; off > 0; off >>= 1) v = max_nonneg(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  const int lane = static_cast<int>(threadIdx.x & 31u), warp = static_cast<int>(threadIdx.x >> 5);
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? warp_max[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) v = max_nonneg(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  }
  __syncthreads();  // warp_max may be reused by a following call
  return v;
}

__device__ __forceinline__ uint32_t word_of(const uint8_t* b) {
  return static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) | (static_cast<uint32_t>(b[2]) << 16) |
         (static_cast<uint32_t>(b[3]) << 24);
}

// dst[0..N) = b[0..N), with 16- or 8-byte stores when dst allows (N a multiple of 8).
template <int N>
__device__ __forceinline__ void store_bytes(uint8_t* dst, const uint8_t (&b)[N]) {
  static_assert(N % 8 == 0, "store_bytes: N must be a multiple of 8");
  if constexpr (N % 16 == 0) {
    if (aligned_to(dst, 16)) {
      for (int i = 0; i < N / 16; ++i)
        reinterpret_cast<uint4*>(dst)[i] =
            make_uint4(word_of(b + 16 * i), word_of(b + 16 * i + 4), word_of(b + 16 * i + 8), word_of(b + 16 * i + 12));
      return;
    }
  }
  if (aligned_to(dst, 8)) {
    for (int i = 0; i < N / 8; ++i)
      reinterpret_cast<uint2*>(dst)[i] = make_uint2(word_of(b + 8 * i), word_of(b + 8 * i + 4));
    return;
  }
  for (int i = 0; i < N; ++i) dst[i] = b[i];
}

// ---- FP8 / FP4 round-to-nearest encodes in hardware -------------------------------------------------
// Selected at compile time per architecture; everywhere else (host pass, sm_80, E2M1 below sm_100a) the
// shared numerics (num::float_to_e4m3 / e5m2 / e2m1), which stay the reference of both paths.
// Instructions (PTX ISA for CUDA 13.0, "Data Movement and Conversion Instructions: cvt",
// docs.nvidia.com/cuda/parallel-thread-execution/#data-movement-and-conversion-instructions-cvt):
//   cvt.rn.satfinite.e4m3x2.f32 d, a, b / .e5m2x2: sm_89+; d is .b16, "the value converted from input a
//     is stored in the upper 8 bits of d and the value converted from input b ... in the lower 8 bits";
//   cvt.rn.satfinite.e2m1x2.f32 d, a, b: arch-specific targets only (sm_100a/103a, also 110a/120a/121a
//     and the f families; nvcc 13.0's ptxas refuses it for plain sm_100/sm_120 and for sm_90a); d is .b8,
//     a in the upper nibble, b in the lower.
// cuda_fp8.hpp / cuda_fp4.hpp (CUDA 13.0) pass (x.x, x.y) as (b, a) the same way. The E2M1 guard is
// cuda_fp8.h's own condition for relying on that instruction (__CUDA_ARCH_FAMILY_SPECIFIC__ in
// [1000, 1300), defined by nvcc for the a and f targets only).
// Why the results equal the shared numerics bit for bit (tests/cuda/test_cuda_conversion.cpp checks every
// one of the 2^32 float inputs on the GPU it runs on, and counts the raw instruction's disagreements
// apart): for every non-NaN input both round to nearest, ties to even, onto the same grid with
// subnormals; .satfinite turns a result beyond the largest finite value, +-Inf included, into that value
// with the input's sign, as the numerics do for every |x| above it (an |x| between max finite and max
// finite + half an ulp rounds down to max finite on both sides); a zero result keeps the input's sign on
// both (cuda_fp8.hpp / cuda_fp4.hpp host paths, which mirror the instruction, do the same). NaN is where
// they may part: PTX gives "NaN" for E4M3/E5M2 without fixing sign or payload and +MAX_NORM for E2M1, the
// numerics 0x7F, 0x7F and 0x7; so the code of a NaN input is chosen in software and the instruction's
// NaN result is never used. Cost: a compare and a select per element, against ~20 integer operations of
// the software encode.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define PL_CVT_FP8_HW 1
#else
#define PL_CVT_FP8_HW 0
#endif
#if defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000 && __CUDA_ARCH_FAMILY_SPECIFIC__ < 1300
#define PL_CVT_E2M1_HW 1
#else
#define PL_CVT_E2M1_HW 0
#endif

__device__ __forceinline__ bool is_nan(float x) { return (num::float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

// Which encodes of this compilation are the hardware ones (bit 0 FP8, bit 1 E2M1), for the tests' report.
__device__ __forceinline__ int hw_cvt_paths() { return PL_CVT_FP8_HW | (PL_CVT_E2M1_HW << 1); }

// The instructions alone (lo in the low byte / nibble), NaN results as the hardware makes them: only
// where PL_CVT_FP8_HW / PL_CVT_E2M1_HW; elsewhere the shared numerics. The kernels use cvt_fp8x2 /
// cvt_e2m1x2 below; the raw forms are for the conformance test's report.
template <bool kE4M3>
__device__ __forceinline__ uint16_t cvt_fp8x2_raw(float lo, float hi) {
#if PL_CVT_FP8_HW
  uint16_t d;
  if constexpr (kE4M3)
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
#else
  const uint8_t a = kE4M3 ? num::float_to_e4m3(lo) : num::float_to_e5m2(lo);
  const uint8_t b = kE4M3 ? num::float_to_e4m3(hi) : num::float_to_e5m2(hi);
  return static_cast<uint16_t>(a | (b << 8));
#endif
}

__device__ __forceinline__ uint8_t cvt_e2m1x2_raw(float lo, float hi) {
#if PL_CVT_E2M1_HW
  uint16_t d;
  asm("{\n .reg .b8 t;\n cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n mov.b16 %0, {t, 0};\n}" : "=h"(d) : "f"(hi), "f"(lo));
  return static_cast<uint8_t>(d);
#else
  return num::pack_e2m1_pair(num::float_to_e2m1(lo), num::float_to_e2m1(hi));
#endif
}

// The FP8 codes of lo (low byte) and hi (high byte): num::float_to_e4m3 (kE4M3) or float_to_e5m2, bit
// for bit (NaN -> 0x7F whatever the instruction gives).
template <bool kE4M3>
__device__ __forceinline__ uint16_t cvt_fp8x2(float lo, float hi) {
  uint16_t d = cvt_fp8x2_raw<kE4M3>(lo, hi);
  if (PL_CVT_FP8_HW && is_nan(lo)) d = static_cast<uint16_t>((d & 0xFF00u) | 0x7Fu);
  if (PL_CVT_FP8_HW && is_nan(hi)) d = static_cast<uint16_t>((d & 0x00FFu) | 0x7F00u);
  return d;
}

// The storage byte of two E2M1 codes, lo in bits 3:0: num::pack_e2m1_pair(float_to_e2m1(lo),
// float_to_e2m1(hi)) bit for bit (NaN -> 0x7).
__device__ __forceinline__ uint8_t cvt_e2m1x2(float lo, float hi) {
  uint8_t d = cvt_e2m1x2_raw(lo, hi);
  if (PL_CVT_E2M1_HW && is_nan(lo)) d = static_cast<uint8_t>((d & 0xF0u) | 0x7u);
  if (PL_CVT_E2M1_HW && is_nan(hi)) d = static_cast<uint8_t>((d & 0x0Fu) | 0x70u);
  return d;
}

// Blocks for a grid-stride loop over `items`: enough to fill the device, at least one.
inline unsigned grid_stride_blocks(int64_t items, int threads, int num_sms) {
  const int64_t want = (items + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(num_sms > 0 ? num_sms : 132) * 8;
  return static_cast<unsigned>(want < 1 ? 1 : (want < cap ? want : cap));
}

// ---- combining the per-block maxima of one launch ----------------------------------------------------
// The blocks of a launch atomicMax their maxima (non-negative floats, whose bits order as unsigned
// integers) into partial[]; the last block to finish (counted in blocks_done, after a __threadfence, as
// the CUDA programming guide's "last block" reduction) takes them with atomicExch, which also zeroes them,
// stores them into the amax slots and zeroes the count. So the set is zero between launches (module load
// zeroes it), the slots need no cudaMemsetAsync before the launch, and each slot gets the exact max of
// every value offered, as a direct atomicMax into a zeroed slot gave. One set (a __device__ global of the .cu
// file) per kernel or group of kernels whose launches are ordered on the device state's compute stream
// (quantize.cu: one per kernel; rmsnorm.cu, swiglu.cu: one per file); a second device state reducing on the
// same GPU concurrently would need its own sets.
struct AmaxCombine {
  unsigned int partial[2];
  unsigned int blocks_done;
};
// Thread 0 of every block: m into d0, d1, d2 and m1 into e0 (null slots skipped).
__device__ inline void combine_amax(AmaxCombine& c, float m, float* d0, float* d1, float* d2, float m1, float* e0) {
  if (d0 != nullptr || d1 != nullptr || d2 != nullptr) atomicMax(&c.partial[0], __float_as_uint(m));
  if (e0 != nullptr) atomicMax(&c.partial[1], __float_as_uint(m1));
  __threadfence();  // the maxima above are visible device-wide before this block is counted
  if (atomicAdd(&c.blocks_done, 1u) != gridDim.x * gridDim.y - 1) return;
  __threadfence();
  const float all = __uint_as_float(atomicExch(&c.partial[0], 0u));
  const float all1 = __uint_as_float(atomicExch(&c.partial[1], 0u));
  if (d0 != nullptr) *d0 = all;
  if (d1 != nullptr) *d1 = all;
  if (d2 != nullptr) *d2 = all;
  if (e0 != nullptr) *e0 = all1;
  atomicExch(&c.blocks_done, 0u);
}

// ---- the amax of a producer's output (op_list.h, RMSNorm: out_amax) ------------------------------------
// RMSNorm forward and SwiGLU forward and backward reduce max |stored value| of what they write into one or two
// slots (f32 [1] or [2]) as quantize's amax pass would, so a per-tensor quantizer of that output skips its
// pass (Transformer Engine's fused norm/activation amax). The slots: the first and the second (or null).
struct OutAmax {
  float* a0 = nullptr;
  float* a1 = nullptr;
  __host__ __device__ bool wanted() const { return a0 != nullptr; }
};
inline OutAmax out_amax_slots(const Tensor& t) {
  OutAmax o;
  if (t.data == nullptr) return o;
  o.a0 = static_cast<float*>(t.data);
  if (t.numel() == 2) o.a1 = o.a0 + 1;
  return o;
}
// An empty output's amax: 0 in the slots (the CPU's value), on the stream, for the launchers that launch nothing.
inline void zero_out_amax(cudaStream_t s, const Tensor& t, const char* op) {
  if (t.data != nullptr) check(cudaMemsetAsync(t.data, 0, sizeof(float) * t.numel(), s), op, "out_amax (empty output)");
}
// Every thread of every block of the grid (o.wanted() uniform over the grid): m, this thread's max |v| of
// the values it stored, into the slots (the last block writes them, combine_amax).
__device__ __forceinline__ void reduce_out_amax(AmaxCombine& c, float m, const OutAmax& o) {
  m = block_max(m);
  if (threadIdx.x == 0) combine_amax(c, m, o.a0, o.a1, nullptr, 0.0f, nullptr);
}

// ---- padding of the swizzled scale arrays -----------------------------------------------------------
// Zeroes the padding of a swizzled scale array (num::padded_scale_rows(rows) x pc bytes, of which rows x nb
// are scales) in copy rows [r_lo, r_hi): the columns nb..pc of real rows and every column of padding rows.
// Called by all threads of the encode block that owns the last tile of those copy rows (pad_swizzled), so
// the pass that writes the scales writes every padding byte too: no cudaMemsetAsync before it.
__device__ inline void zero_scale_padding(uint8_t* swz, int64_t rows, int64_t nb, int64_t pc, int64_t r_lo, int64_t r_hi) {
  const int64_t pad_c = pc - nb, real_hi = r_hi < rows ? r_hi : rows;
  for (int64_t i = threadIdx.x; i < (real_hi - r_lo) * pad_c; i += blockDim.x)
    swz[num::swizzled_scale_offset(r_lo + i / pad_c, nb + i % pad_c, pc)] = 0;
  const int64_t p_lo = r_lo > rows ? r_lo : rows;
  for (int64_t i = threadIdx.x; i < (r_hi - p_lo) * pc; i += blockDim.x)
    swz[num::swizzled_scale_offset(p_lo + i / pc, i % pc, pc)] = 0;
}

// The padding owned by tile (r0, c0) of x[R, C] for the rowwise copy (rows R, C/block scales each) and
// the columnwise copy (rows C, R/block scales each) with row_pc / col_pc padded scale columns;
// null arrays are skipped. The last tile column owns the padding of its 64 rowwise copy rows (the last
// tile row also the padding rows up to padded_scale_rows(R)); the last tile row the same for the
// columnwise copy.
__device__ inline void pad_swizzled(uint8_t* row_swz, int64_t row_pc, uint8_t* col_swz, int64_t col_pc, int64_t R,
                             int64_t C, int64_t r0, int64_t c0, int64_t block) {
  const bool last_r = r0 + kTile >= R, last_c = c0 + kTile >= C;
  if (row_swz != nullptr && last_c)
    zero_scale_padding(row_swz, R, C / block, row_pc, r0, last_r ? num::padded_scale_rows(R) : r0 + kTile);
  if (col_swz != nullptr && last_r)
    zero_scale_padding(col_swz, C, R / block, col_pc, c0, last_c ? num::padded_scale_rows(C) : c0 + kTile);
}

// ---- a copy as the reading kernels see it (dequantize.cu, quant_stats.cu) ---------------------------
// One copy as the kernels see it. The block scales are read from the swizzled array (what the GEMMs
// read): the compact one is not written by a quantize with compact_scales = false.
struct CopyView {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;  // swizzled, NVFP4 / MXFP8 only
  int64_t padded_cols = 0;          // of the swizzled array: roundup(cols/block, 4)
  const float* amax = nullptr;
  const float* scale_inv = nullptr;
  int64_t rows = 0, cols = 0;
  int format = 0;  // QuantFormat
};

constexpr int kNvfp4 = static_cast<int>(QuantFormat::NVFP4);
constexpr int kMxfp8 = static_cast<int>(QuantFormat::MXFP8);
constexpr int kE4M3 = static_cast<int>(QuantFormat::FP8_E4M3);

// Scale of block b of copy row r.
__device__ __forceinline__ uint8_t block_scale(const CopyView& c, int64_t r, int64_t b) {
  return c.scales[num::swizzled_scale_offset(r, b, c.padded_cols)];
}

// The CPU's dequantized_value(c, r, k): code value times block scale, global scale included.
__device__ __forceinline__ float dequantized_value(const CopyView& c, int64_t r, int64_t k) {
  if (c.format == kNvfp4) {
    const uint8_t byte = c.data[r * (c.cols / 2) + k / 2];
    const uint8_t code = (k & 1) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xF);
    return num::e2m1_to_float(code) * num::nvfp4_dequant_factor(block_scale(c, r, k / 16), *c.amax);
  }
  if (c.format == kMxfp8)
    return num::e4m3_to_float(c.data[r * c.cols + k]) * num::ue8m0_to_float(block_scale(c, r, k / 32));
  const uint8_t code = c.data[r * c.cols + k];
  const float v = c.format == kE4M3 ? num::e4m3_to_float(code) : num::e5m2_to_float(code);
  return v * *c.scale_inv;
}

// The view of a checked copy of format f (backend/op_checks.cpp).
inline CopyView copy_view(const QuantizedCopy& c, QuantFormat f) {
  const int64_t blk = quant_block_size(f);
  CopyView v;
  v.data = c.data.ptr<const uint8_t>();
  v.scales = blk > 1 ? c.scales_swizzled.ptr<const uint8_t>() : nullptr;
  v.padded_cols = blk > 1 ? num::padded_scale_cols(c.cols / blk) : 0;
  v.amax = c.amax.ptr<const float>();
  v.scale_inv = c.scale_inv.ptr<const float>();
  v.rows = c.rows;
  v.cols = c.cols;
  v.format = static_cast<int>(f);
  return v;
}

}  // namespace pl::cuda::qk
