// CUDA quantizers (backend/quantize.h: quantize): NVFP4 (1x16 RN or SR, 16x16 tiles, RHT'd
// columnwise copy), MXFP8 and FP8 per-tensor current scaling, bit-identical with the CPU reference
// (backend/cpu/quantize.cpp): every scale and code comes from the same lib/numerics/ functions on
// the same float values, and the only cross-thread reductions are maxima (order-independent).
//
// Two kernel sets, chosen per device state (DeviceState::reference_quantize_kernels, pretrain_llama
// --quantize-kernels): "fast" (the default) and "reference" (the kernels as they were before issue 40,
// kept as the bit-for-bit reference of the fast ones; tests/ops/test_quantize.cpp compares them).
//
// Schedule, all on the device state's compute stream with no host round trip:
//   (no memsets: the amax slots are stored by the last block of the pass that reduces them,
//   combine_amax, and the padding of the swizzled scale arrays is zeroed by the encode pass)
//   1. amax pass (NVFP4, FP8 current scaling): max |x| (amax_kernel), and for an RHT'd columnwise copy
//      the max of the RHT outputs, computed in the same pass over x (fast: rht_amax_kernel with
//      num::rht16_fast_fp32, then rht_fallback_kernel for the rare chunks it rejects; reference:
//      reference_rht_amax_kernel with num::rht16 inline). Delayed scaling under the fast set has no
//      amax pass: its scale is known, so fp8_encode_kernel casts and reduces the amax in one read.
//   2. encode pass: one block per 64x64 tile of x, staged through shared memory; each thread makes
//      one 16-block (NVFP4), 32-block (MXFP8) or 16-element run (FP8) of the rowwise copy from a
//      tile row and one of the columnwise copy from a tile column, reading the global scale from the
//      amax slot on the device, and writes codes, compact scales and swizzled scales directly.
//      MXFP8 needs no global scale, so its amax is reduced inside the encode pass (one pass over x).
//      NVFP4 (S_enc) and FP8 current scaling need the whole tensor's amax before the first code, so
//      their amax pass stays separate (until the producers emit it: docs/PERF-GPU-PLAN.md). The fast
//      NVFP4 encode RHTs with num::rht16_fast and leaves rejected chunks to rht_fallback_kernel.
//      Round-to-nearest codes come from the cvt instructions where the architecture has them
//      (qk::cvt_fp8x2 / cvt_e2m1x2, quantize_common.cuh), the same bits as the shared numerics;
//      stochastic rounding stays on the shared Philox rule.
// The encode pass makes both copies from one read of x. No FP64 anywhere; the exact RHT's integer paths
// (num::rht16) run only in the reference kernels and in rht_fallback_kernel.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/device_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quantize_common.cuh"
#include "numerics/fp4.h"
#include "numerics/delayed_scaling.h"
#include "numerics/fp8.h"
#include "numerics/hadamard.h"
#include "numerics/nvfp4.h"
#include "numerics/philox.h"
#include "numerics/swizzle.h"

namespace pl::cuda {

namespace {

using qk::kThreads;
using qk::kTile;
using qk::kTileLd;

// ---- the amax combine sets (qk::AmaxCombine, quantize_common.cuh): one per kernel that uses it ----------
__device__ qk::AmaxCombine g_amax_pass_combine;   // amax_kernel
__device__ qk::AmaxCombine g_mxfp8_amax_combine;  // mxfp8_encode_kernel
__device__ qk::AmaxCombine g_fp8_amax_combine;    // fp8_encode_kernel<T, true> with a given (delayed) scale

// ---- the RHT's exact fallback ------------------------------------------------------------------------
// The fast kernels (kFast) take num::rht16_fast (hadamard.h: two FP32 lanes, no stack), which accepts
// every BF16 chunk spanning <= 32 binades. A chunk it rejects (wider spans, Inf/NaN, exact cancellations
// to zero, values below 2^-100) is appended to a list, as g * C + c for the 16 rows 16g.. of column c, and
// finished by rht_fallback_kernel, which calls the exact num::rht16 (its int64 and 288-bit paths and
// their 640-byte stack live only there). One list per phase: the amax pass's (the fallback adds the
// rejected chunks' outputs to the RHT amax before any code is made) and the encode pass's (the fallback
// encodes them). More than kFallbackCap rejections in one launch: the fallback redoes every chunk of x
// exactly (same codes, same amax: slow but right). Like AmaxCombine, a list is empty between launches
// (the fallback's last block empties it) and belongs to the device state's compute stream.
constexpr unsigned kFallbackCap = 1u << 16;
struct RhtFallbackList {
  unsigned long long count;
  unsigned int blocks_done;
  unsigned long long chunk[kFallbackCap];
};
__device__ RhtFallbackList g_rht_amax_fallback;    // rht_amax_kernel -> rht_fallback_kernel (amax)
__device__ RhtFallbackList g_rht_encode_fallback;  // nvfp4_encode_kernel<T, true> -> rht_fallback_kernel

__device__ __forceinline__ void flag_for_fallback(RhtFallbackList& l, int64_t chunk) {
  const unsigned long long k = atomicAdd(&l.count, 1ull);
  if (k < kFallbackCap) l.chunk[k] = static_cast<unsigned long long>(chunk);
}

// The 16 values x[16g .. 16g+15][c] (a column chunk: one column of 16 consecutive rows).
template <typename T>
__device__ __forceinline__ void load_column_chunk(const T* __restrict__ x, int64_t C, int64_t g, int64_t c,
                                                  float (&v)[16]) {
  const T* p = x + 16 * g * C + c;
  for (int k = 0; k < 16; ++k, p += C) v[k] = qk::load_elem(p, 0);  // one 64-bit address live, not 16
}

// ---- amax pass -------------------------------------------------------------------------------------
// plain0/plain1 (may be null): max |x| over x[R, C]. rht (may be null; then R % 16 == 0): max |y| over
// the RHT outputs y = rht16(x[16g .. 16g+15][c]) for every 16-row group g and column c, i.e. over
// RHT(xᵀ) as the columnwise copy sees it. record (may be null; only with plain0 or plain1): the plain amax
// once more (delayed scaling's history entry). The slots are written by the last block (combine_amax).
// The plain pass: max |x| into plain0 / plain1 / record (either kernel set). Should reach ~90% of HBM
// bandwidth (16-byte loads, grid-stride).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* __restrict__ x, int64_t n, float* plain0, float* plain1, float* record) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float m = 0.0f;
  int64_t done = 0;
  if (qk::aligned_to(x, 16)) {
    constexpr int kV = 16 / static_cast<int>(sizeof(T));
    const int64_t nv = n / kV;
    for (int64_t i = tid; i < nv; i += stride) {
      float v[kV];
      qk::load_vec16(x + i * kV, v);
      for (int k = 0; k < kV; ++k) m = qk::max_abs(m, v[k]);
    }
    done = nv * kV;
  }
  for (int64_t i = done + tid; i < n; i += stride) m = qk::max_abs(m, qk::load_elem(x, i));
  m = qk::block_max(m);
  if (threadIdx.x == 0) qk::combine_amax(g_amax_pass_combine, m, plain0, plain1, record, 0.0f, nullptr);
}

// The reference kernels' RHT amax (--quantize-kernels reference): grid-stride over (g, c) items with a
// division each, num::rht16 inline (its 640-byte stack with it); the plain max too when plain0 / plain1.
template <typename T>
__global__ void __launch_bounds__(kThreads) reference_rht_amax_kernel(const T* __restrict__ x, int64_t R, int64_t C,
                                                                      float* plain0, float* plain1, float* rht) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float m = 0.0f, mr = 0.0f;
  const bool plain = plain0 != nullptr || plain1 != nullptr;
  const int64_t items = (R / 16) * C;  // (16-row group g, column c), c fastest: coalesced reads
  for (int64_t i = tid; i < items; i += stride) {
    const int64_t g = i / C, c = i % C;
    float v[16];
    for (int k = 0; k < 16; ++k) v[k] = qk::load_elem(x, (16 * g + k) * C + c);
    if (plain)
      for (int k = 0; k < 16; ++k) m = qk::max_abs(m, v[k]);
    num::rht16(v, v, num::kRhtSignMask);
    for (int k = 0; k < 16; ++k) mr = qk::max_abs(mr, v[k]);
  }
  m = qk::block_max(m);
  mr = qk::block_max(mr);
  if (threadIdx.x == 0) qk::combine_amax(g_amax_pass_combine, m, plain0, plain1, nullptr, mr, rht);
}

// The fast kernels' RHT amax (and the plain one with it, when plain0/plain1): a 2D grid (x: columns, one
// per thread, so a warp's loads of a row are coalesced; y: 16-row groups, grid-strided), no integer
// division, num::rht16_fast_fp32 (rounded to BF16 once per thread: rounding is monotone; the plain max
// comes from its split), rejected chunks listed for rht_fallback_kernel (launched next), which adds them
// to both maxima. <= 64 registers, no stack (check_kernel_resources.sh).
// Should reach: compute-bound at ~25 FP32 operations per element, roughly 50-60% of HBM bandwidth on an
// H200 (docs/PERF-GPU-PLAN.md).
template <typename T>
__global__ void __launch_bounds__(kThreads, 4)
    rht_amax_kernel(const T* __restrict__ x, int64_t R, int64_t C, float* plain0, float* plain1, float* rht) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // gridDim.x * 256 >= C
  const bool plain = plain0 != nullptr || plain1 != nullptr;
  float m = 0.0f, mr = 0.0f;
  if (c < C)
    for (int64_t g = blockIdx.y; g < R / 16; g += gridDim.y) {
      float v[16], chunk_max;
      load_column_chunk(x, C, g, c, v);
      if (num::rht16_fast_fp32(v, num::kRhtSignMask, &chunk_max)) {
        for (int k = 0; k < 16; ++k) mr = qk::max_abs(mr, v[k]);
        if (plain) m = qk::max_nonneg(m, chunk_max);
      } else {  // the fallback adds this chunk to both maxima
        flag_for_fallback(g_rht_amax_fallback, g * C + c);
      }
    }
  mr = num::round_bf16(mr);  // max |RN_bf16(y)| = RN_bf16(max |y|)
  m = qk::block_max(m);
  mr = qk::block_max(mr);
  if (threadIdx.x == 0) qk::combine_amax(g_amax_pass_combine, m, plain0, plain1, nullptr, mr, rht);
}

// ---- NVFP4 encode pass -----------------------------------------------------------------------------
struct Nvfp4Out {  // one copy; data == nullptr when the copy is not requested
  uint8_t* data = nullptr;      // [rows, cols/2]
  uint8_t* scales = nullptr;    // [rows, cols/16]; nullptr: compact scales not written
  uint8_t* swizzled = nullptr;  // 128x4 tiles, padding zeroed beforehand
  const float* amax = nullptr;  // written by the amax pass
  float* scale_inv = nullptr;
  int64_t padded_cols = 0;  // roundup(cols/16, 4)
  uint32_t stream = 0;      // SR stream id of this copy
};

struct Nvfp4Args {
  int64_t rows = 0, cols = 0, tiles_c = 0;  // x[rows, cols], tiles per tile row
  Nvfp4Out row, col;
  bool block_2d = false, rht = false, sr = false;
  uint64_t seed = 0, counter = 0;
};

// Codes and scale of block `blk` of copy row `row` (nb blocks per row) from its 16 source values,
// exactly as the CPU's quantize_nvfp4_copy: 2D tiles (RN, tile amax given), 1x16 SR, or 1x16 RN.
__device__ __forceinline__ void nvfp4_encode_block(const Nvfp4Out& o, const float (&v)[16], int64_t row, int64_t blk,
                                                   int64_t nb, bool block_2d, float tile_amax, bool sr, uint64_t seed,
                                                   uint64_t counter) {
  const float s_enc = num::nvfp4_global_encode_scale(*o.amax);
  uint8_t sc = 0;
  uint8_t packed[8];
  if (sr && !block_2d) {  // stochastic rounding: the shared Philox rule (num::float_to_e2m1_sr), never cvt.rs
    uint8_t rb[16], code[16];
    num::sr_random_bytes16(seed, o.stream, counter, static_cast<uint64_t>(row * nb + blk), rb);
    num::nvfp4_quantize_block16_sr(v, s_enc, rb, &sc, code);
    for (int k = 0; k < 8; ++k) packed[k] = num::pack_e2m1_pair(code[2 * k], code[2 * k + 1]);
  } else {  // RN: num::nvfp4_quantize_block16 (1x16) or the 2D tile rule, codes by qk::cvt_e2m1x2
    const float enc = num::nvfp4_block_scale_and_encode(block_2d ? tile_amax : num::nvfp4_abs_max(v, 16), s_enc, &sc);
    for (int k = 0; k < 8; ++k) packed[k] = qk::cvt_e2m1x2(v[2 * k] * enc, v[2 * k + 1] * enc);  // num::nvfp4_encode
  }
  qk::store_bytes(o.data + row * (nb * 8) + blk * 8, packed);
  if (o.scales != nullptr) o.scales[row * nb + blk] = sc;
  o.swizzled[num::swizzled_scale_offset(row, blk, o.padded_cols)] = sc;
}

// One block per 64x64 tile of x. Thread t handles item (q, b) = (t / 4, t % 4): rowwise, block b of
// tile row q; columnwise, the 16 rows 16b.. of tile column q (RHT'd when asked). For 2D, first the
// 16 tile amaxes of the 16x16 sub-tiles (16 threads per sub-tile, shuffle max).
// kFast: the RHT by num::rht16_fast, rejected chunks listed for rht_fallback_kernel (launched next), which
// encodes them; no stack (checked by scripts/check_kernel_resources.sh). !kFast: num::rht16 inline.
template <typename T, bool kFast>
__global__ void __launch_bounds__(kThreads) nvfp4_encode_kernel(const T* __restrict__ x, Nvfp4Args a) {
  __shared__ float s[kTile][kTileLd];
  __shared__ float tile_amax[kTile / 16][kTile / 16];
  const int64_t tile = blockIdx.x;
  const int64_t r0 = tile / a.tiles_c * kTile, c0 = tile % a.tiles_c * kTile;
  qk::load_tile(s, x, a.rows, a.cols, r0, c0);
  qk::pad_swizzled(a.row.data != nullptr ? a.row.swizzled : nullptr, a.row.padded_cols,
               a.col.data != nullptr ? a.col.swizzled : nullptr, a.col.padded_cols, a.rows, a.cols, r0, c0, 16);
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  if (a.block_2d) {  // both dims are multiples of 16 here, so a sub-tile is wholly inside x or outside
    const int sub = t / 16, i = t % 16, tr = sub / 4, tc = sub % 4;
    float m = 0.0f;
    for (int k = 0; k < 16; ++k) m = qk::max_abs(m, s[tr * 16 + i][tc * 16 + k]);
    for (int off = 8; off > 0; off >>= 1) m = qk::max_nonneg(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    if (i == 0) tile_amax[tr][tc] = m;
    __syncthreads();
  }
  const int q = t / 4, b = t % 4;
  if (a.row.data != nullptr) {
    const int64_t r = r0 + q, c = c0 + 16 * b;
    if (r < a.rows && c < a.cols) {  // cols % 16 == 0: the block is whole
      float v[16];
      for (int k = 0; k < 16; ++k) v[k] = s[q][16 * b + k];
      nvfp4_encode_block(a.row, v, r, c / 16, a.cols / 16, a.block_2d, a.block_2d ? tile_amax[q / 16][b] : 0.0f,
                         a.sr, a.seed, a.counter);
    }
  }
  if (a.col.data != nullptr) {
    const int64_t c = c0 + q, r = r0 + 16 * b;  // copy row c, copy block r / 16
    if (c < a.cols && r < a.rows) {             // rows % 16 == 0: the block is whole
      float v[16];
      for (int k = 0; k < 16; ++k) v[k] = s[16 * b + k][q];
      bool encode = true;
      if (a.rht) {
        if constexpr (kFast) {
          encode = num::rht16_fast(v, v, num::kRhtSignMask);
          if (!encode) flag_for_fallback(g_rht_encode_fallback, r / 16 * a.cols + c);
        } else {
          num::rht16(v, v, num::kRhtSignMask);
        }
      }
      if (encode)
        nvfp4_encode_block(a.col, v, c, r / 16, a.rows / 16, a.block_2d, a.block_2d ? tile_amax[b][q / 16] : 0.0f,
                           a.sr, a.seed, a.counter);
    }
  }
  if (tile == 0 && t == 0) {
    if (a.row.data != nullptr)
      *a.row.scale_inv = num::nvfp4_global_decode_scale(num::nvfp4_global_encode_scale(*a.row.amax));
    if (a.col.data != nullptr)
      *a.col.scale_inv = num::nvfp4_global_decode_scale(num::nvfp4_global_encode_scale(*a.col.amax));
  }
}

// The exact RHT of the chunks the fast kernels rejected (see RhtFallbackList): encode (a.col.data set:
// their codes and scales of the RHT'd columnwise copy, as nvfp4_encode_kernel would have made them) or
// amax (their outputs maxed into the RHT amax slot `amax`, and their inputs into the plain slots plain0 /
// plain1 when given, all written by the amax pass before). a.rows and
// a.cols are x's. A fixed grid that reads the list's length on the device: no host round trip, and
// ~3 us when the list is empty (the usual case). The last block empties the list.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rht_fallback_kernel(const T* __restrict__ x, bool encode, float* amax, float* plain0, float* plain1, Nvfp4Args a) {
  RhtFallbackList& list = encode ? g_rht_encode_fallback : g_rht_amax_fallback;
  const unsigned long long n = list.count;  // final: the kernel that appends ran before this one
  const int64_t C = a.cols, groups = a.rows / 16;
  const bool all = n > kFallbackCap;
  const int64_t items = all ? groups * C : static_cast<int64_t>(n);
  float m = 0.0f, mp = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t chunk = all ? i : static_cast<int64_t>(list.chunk[i]);
    const int64_t g = chunk / C, c = chunk % C;
    float v[16];
    load_column_chunk(x, C, g, c, v);
    for (int k = 0; k < 16; ++k) mp = qk::max_abs(mp, v[k]);
    num::rht16(v, v, num::kRhtSignMask);
    if (encode) {
      nvfp4_encode_block(a.col, v, c, g, groups, false, 0.0f, a.sr, a.seed, a.counter);
    } else {
      for (int k = 0; k < 16; ++k) m = qk::max_abs(m, v[k]);
    }
  }
  if (!encode) {
    m = qk::block_max(m);
    mp = qk::block_max(mp);
    if (threadIdx.x == 0) {
      const auto raise = [](float* slot, float v) {
        if (slot != nullptr && v > 0.0f) atomicMax(reinterpret_cast<unsigned int*>(slot), __float_as_uint(v));
      };
      raise(amax, m);
      raise(plain0, mp);
      raise(plain1, mp);
    }
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&list.blocks_done, 1u) == gridDim.x - 1) {  // every block has read the count
      list.count = 0;
      list.blocks_done = 0;
    }
  }
}

// ---- MXFP8 encode pass (amax fused) ----------------------------------------------------------------
struct Mxfp8Out {
  uint8_t* data = nullptr;  // [rows, cols]; nullptr when not requested
  uint8_t* scales = nullptr;  // nullptr: compact scales not written
  uint8_t* swizzled = nullptr;
  float* amax = nullptr;  // reduced here (combine_amax)
  float* scale_inv = nullptr;
  int64_t padded_cols = 0;
};

struct Mxfp8Args {
  int64_t rows = 0, cols = 0, tiles_c = 0;
  Mxfp8Out row, col;
  float* col_amax_only = nullptr;  // columnwise_amax without the columnwise copy
};

// One 32-block as the CPU's quantize_mxfp8_copy; returns the block amax.
__device__ __forceinline__ float mxfp8_encode_block(const Mxfp8Out& o, const float (&v)[32], int64_t row,
                                                    int64_t blk, int64_t nb) {
  float bamax = 0.0f;
  for (int k = 0; k < 32; ++k) bamax = qk::max_abs(bamax, v[k]);
  const uint8_t e = num::mxfp8_block_scale(bamax);
  const float es = num::mxfp8_element_scale(e);
  uint8_t code[32];
  for (int k = 0; k < 16; ++k) {  // num::float_to_e4m3(v * es), two at a time
    const uint16_t d = qk::cvt_fp8x2<true>(v[2 * k] * es, v[2 * k + 1] * es);
    code[2 * k] = static_cast<uint8_t>(d & 0xFFu);
    code[2 * k + 1] = static_cast<uint8_t>(d >> 8);
  }
  qk::store_bytes(o.data + row * (nb * 32) + blk * 32, code);
  if (o.scales != nullptr) o.scales[row * nb + blk] = e;
  o.swizzled[num::swizzled_scale_offset(row, blk, o.padded_cols)] = e;
  return bamax;
}

// One block per 64x64 tile: threads 0..127 make the rowwise blocks (tile row t/2, block t%2), threads
// 128..255 the columnwise ones (tile column, 32 rows). Either set covers every element of the tile, so
// the block max of the block amaxes is the tile's max |x|.
template <typename T>
__global__ void __launch_bounds__(kThreads) mxfp8_encode_kernel(const T* __restrict__ x, Mxfp8Args a) {
  __shared__ float s[kTile][kTileLd];
  const int64_t tile = blockIdx.x;
  const int64_t r0 = tile / a.tiles_c * kTile, c0 = tile % a.tiles_c * kTile;
  qk::load_tile(s, x, a.rows, a.cols, r0, c0);
  qk::pad_swizzled(a.row.data != nullptr ? a.row.swizzled : nullptr, a.row.padded_cols,
               a.col.data != nullptr ? a.col.swizzled : nullptr, a.col.padded_cols, a.rows, a.cols, r0, c0, 32);
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  const int u = t % (kThreads / 2), q = u / 2, b = u % 2;
  float m = 0.0f;
  if (t < kThreads / 2) {
    const int64_t r = r0 + q, c = c0 + 32 * b;
    if (a.row.data != nullptr && r < a.rows && c < a.cols) {
      float v[32];
      for (int k = 0; k < 32; ++k) v[k] = s[q][32 * b + k];
      m = mxfp8_encode_block(a.row, v, r, c / 32, a.cols / 32);
    }
  } else {
    const int64_t c = c0 + q, r = r0 + 32 * b;
    if (a.col.data != nullptr && c < a.cols && r < a.rows) {
      float v[32];
      for (int k = 0; k < 32; ++k) v[k] = s[32 * b + k][q];
      m = mxfp8_encode_block(a.col, v, c, r / 32, a.rows / 32);
    }
  }
  m = qk::block_max(m);
  if (t == 0) {
    qk::combine_amax(g_mxfp8_amax_combine, m, a.row.data != nullptr ? a.row.amax : nullptr,
                 a.col.data != nullptr ? a.col.amax : nullptr, a.col_amax_only, 0.0f, nullptr);
    if (tile == 0) {
      if (a.row.data != nullptr) *a.row.scale_inv = 1.0f;
      if (a.col.data != nullptr) *a.col.scale_inv = 1.0f;
    }
  }
}

// ---- FP8 per-tensor encode pass --------------------------------------------------------------------
struct Fp8Out {
  uint8_t* data = nullptr;  // [rows, cols]; nullptr when not requested
  const float* amax = nullptr;
  const float* scale = nullptr;  // delayed scaling's given scale; null: current scaling from amax
  float* scale_inv = nullptr;
};

struct Fp8Args {
  int64_t rows = 0, cols = 0, tiles_c = 0;
  Fp8Out row, col;
  bool e4m3 = true;
  // Delayed scaling (the scale given) under the fast kernels: the amax slots this pass reduces into
  // (combine_amax) instead of a separate amax pass; null when not asked.
  float* amax0 = nullptr;
  float* amax1 = nullptr;
  float* record = nullptr;
};

// The codes of a run of n <= 16 values (the first n of v) at dst: one 16-byte store when whole and
// aligned. The codes are packed into four words as they are made, and a partial run stores its bytes with
// constant indices, so nothing goes through local memory.
__device__ __forceinline__ void fp8_encode_run(const float (&v)[16], int n, float scale, bool e4m3, uint8_t* dst) {
  uint32_t w[4] = {0, 0, 0, 0};
  for (int k = 0; k < 8; ++k) {  // num::float_to_e4m3 / e5m2(v * scale), two at a time
    const float lo = v[2 * k] * scale, hi = v[2 * k + 1] * scale;
    const uint16_t d = e4m3 ? qk::cvt_fp8x2<true>(lo, hi) : qk::cvt_fp8x2<false>(lo, hi);
    w[k / 2] |= static_cast<uint32_t>(d) << (16 * (k % 2));
  }
  if (n == 16 && qk::aligned_to(dst, 16)) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
  for (int k = 0; k < 16; ++k)
    if (k < n) dst[k] = static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)));
}

// The scale of a copy: delayed scaling's given one, else current scaling's from the copy's amax.
__device__ __forceinline__ float fp8_scale(const Fp8Out& o, float fmax) {
  return o.scale != nullptr ? *o.scale : num::fp8_current_scale(*o.amax, fmax);
}

// One block per 64x64 tile; thread t: rowwise, 16 columns 16(t%4).. of tile row t/4; columnwise,
// 16 rows 16(t%4).. of tile column t/4 (clipped at the edges of x).
// With a.amax0/amax1/record set (delayed scaling: its scale is known before the data), the pass also
// reduces max |x| into them: one read of x instead of two. Either copy's runs cover the whole tile.
template <typename T>
__global__ void __launch_bounds__(kThreads) fp8_encode_kernel(const T* __restrict__ x, Fp8Args a) {
  __shared__ float s[kTile][kTileLd];
  const int64_t tile = blockIdx.x;
  const int64_t r0 = tile / a.tiles_c * kTile, c0 = tile % a.tiles_c * kTile;
  qk::load_tile(s, x, a.rows, a.cols, r0, c0);
  __syncthreads();
  const float fmax = a.e4m3 ? num::kE4M3Max : num::kE5M2Max;
  const int t = static_cast<int>(threadIdx.x);
  const int q = t / 4, seg = t % 4;
  float m = 0.0f;
  if (a.row.data != nullptr) {
    const int64_t r = r0 + q, c = c0 + 16 * seg;
    if (r < a.rows && c < a.cols) {
      const float scale = fp8_scale(a.row, fmax);
      float v[16];
      for (int k = 0; k < 16; ++k) v[k] = s[q][16 * seg + k];
      for (int k = 0; k < 16; ++k) m = qk::max_abs(m, v[k]);  // 0 outside x
      const int n = a.cols - c < 16 ? static_cast<int>(a.cols - c) : 16;
      fp8_encode_run(v, n, scale, a.e4m3, a.row.data + r * a.cols + c);
    }
  }
  if (a.col.data != nullptr) {
    const int64_t c = c0 + q, r = r0 + 16 * seg;
    if (c < a.cols && r < a.rows) {
      const float scale = fp8_scale(a.col, fmax);
      float v[16];
      for (int k = 0; k < 16; ++k) v[k] = s[16 * seg + k][q];
      if (a.row.data == nullptr)
        for (int k = 0; k < 16; ++k) m = qk::max_abs(m, v[k]);
      const int n = a.rows - r < 16 ? static_cast<int>(a.rows - r) : 16;
      fp8_encode_run(v, n, scale, a.e4m3, a.col.data + c * a.rows + r);
    }
  }
  if (a.amax0 != nullptr || a.amax1 != nullptr || a.record != nullptr) {  // uniform over the grid
    m = qk::block_max(m);
    if (t == 0) qk::combine_amax(g_fp8_amax_combine, m, a.amax0, a.amax1, a.record, 0.0f, nullptr);
  }
  if (tile == 0 && t == 0) {
    if (a.row.data != nullptr) *a.row.scale_inv = 1.0f / fp8_scale(a.row, fmax);  // TE: __frcp_rn
    if (a.col.data != nullptr) *a.col.scale_inv = 1.0f / fp8_scale(a.col, fmax);
  }
}

// ---- host side -------------------------------------------------------------------------------------

// The grid of 64x64 tiles (its size is checked in backend/op_checks.cpp).
unsigned tile_grid(int64_t rows, int64_t cols, int64_t* tiles_c) {
  *tiles_c = (cols + kTile - 1) / kTile;
  return static_cast<unsigned>((rows + kTile - 1) / kTile * *tiles_c);
}

template <typename T>
void launch_amax(const DeviceState& st, const T* x, int64_t R, int64_t C, float* plain0, float* plain1, float* rht,
                 const std::string& what, float* record = nullptr) {
  if (rht == nullptr) {
    amax_kernel<T><<<qk::grid_stride_blocks((R * C + 7) / 8, kThreads, st.num_sms), kThreads, 0, st.stream>>>(
        x, R * C, plain0, plain1, record);
    return check_launch(st, "quantize: amax_kernel", what);
  }
  if (st.reference_quantize_kernels) {
    reference_rht_amax_kernel<T><<<qk::grid_stride_blocks((R / 16) * C, kThreads, st.num_sms), kThreads, 0,
                                   st.stream>>>(x, R, C, plain0, plain1, rht);
    return check_launch(st, "quantize: reference_rht_amax_kernel", what);
  }
  // Columns on x, 16-row groups on y (grid-strided), about 8 blocks per SM.
  const int64_t bx = (C + kThreads - 1) / kThreads, groups = R / 16;
  const int64_t want = std::max<int64_t>(1, static_cast<int64_t>(std::max(st.num_sms, 1)) * 8 / bx);
  const dim3 grid(static_cast<unsigned>(bx),
                  static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>({groups, want, 65535}))));
  rht_amax_kernel<T><<<grid, kThreads, 0, st.stream>>>(x, R, C, plain0, plain1, rht);
  check_launch(st, "quantize: rht_amax_kernel", what);
}

// The exact RHT of the chunks the fast rht_amax_kernel (encode == false: into the RHT amax slot `amax`) or
// nvfp4_encode_kernel (encode: their codes) rejected.
template <typename T>
void launch_rht_fallback(const DeviceState& st, const T* x, bool encode, float* amax, float* plain0, float* plain1,
                         const Nvfp4Args& a, const std::string& what) {
  const unsigned blocks = static_cast<unsigned>(std::max(st.num_sms, 1) * 2);
  rht_fallback_kernel<T><<<blocks, kThreads, 0, st.stream>>>(x, encode, amax, plain0, plain1, a);
  check_launch(st, encode ? "quantize: rht_fallback_kernel (encode)" : "quantize: rht_fallback_kernel (amax)", what);
}

template <typename T>
void quantize_nvfp4(const DeviceState& st, QuantizedTensor& q, const T* x, int64_t R, int64_t C,
                    const QuantizeOptions& opt, const std::string& what) {
  Nvfp4Args a;
  a.rows = R;
  a.cols = C;
  a.block_2d = opt.block_2d;
  a.rht = opt.columnwise && opt.rht_columnwise;  // the encode pass RHTs only a copy it makes
  a.sr = opt.stochastic;
  a.seed = opt.seed;
  a.counter = opt.counter;
  auto out = [&](const QuantizedCopy& c, uint32_t stream) {
    Nvfp4Out o;
    o.data = c.data.ptr<uint8_t>();
    o.scales = opt.compact_scales ? c.scales.ptr<uint8_t>() : nullptr;
    o.swizzled = c.scales_swizzled.ptr<uint8_t>();
    o.amax = c.amax.ptr<float>();
    o.scale_inv = c.scale_inv.ptr<float>();
    o.padded_cols = num::padded_scale_cols(c.cols / 16);
    o.stream = stream;
    return o;
  };
  float* plain0 = nullptr;
  float* plain1 = nullptr;
  float* rht = nullptr;
  // Amax slots to compute: those of the requested copies unless given, and the columnwise one alone
  // for columnwise_amax (post-RHT when rht_columnwise).
  const bool col_amax = opt.columnwise ? !opt.amax_given : opt.columnwise_amax;
  if (opt.rowwise) {
    a.row = out(q.rowwise, opt.stream_id);
    if (!opt.amax_given) plain0 = q.rowwise.amax.ptr<float>();
  }
  if (opt.columnwise) {
    a.col = out(q.columnwise, opt.stream_id + 1);
  }
  if (col_amax) {
    if (opt.rht_columnwise)
      rht = q.columnwise.amax.ptr<float>();
    else
      plain1 = q.columnwise.amax.ptr<float>();
  }
  const bool fast = !st.reference_quantize_kernels;
  if (plain0 != nullptr || plain1 != nullptr || rht != nullptr) {
    launch_amax(st, x, R, C, plain0, plain1, rht, what);
    if (fast && rht != nullptr) launch_rht_fallback(st, x, false, rht, plain0, plain1, a, what);
  }
  if (!opt.rowwise && !opt.columnwise) return;
  const unsigned grid = tile_grid(R, C, &a.tiles_c);
  if (fast)
    nvfp4_encode_kernel<T, true><<<grid, kThreads, 0, st.stream>>>(x, a);
  else
    nvfp4_encode_kernel<T, false><<<grid, kThreads, 0, st.stream>>>(x, a);
  check_launch(st, "quantize: nvfp4_encode_kernel", what);
  if (fast && a.rht) launch_rht_fallback(st, x, true, nullptr, nullptr, nullptr, a, what);
}

template <typename T>
void quantize_mxfp8(const DeviceState& st, QuantizedTensor& q, const T* x, int64_t R, int64_t C,
                    const QuantizeOptions& opt, const std::string& what) {
  Mxfp8Args a;
  a.rows = R;
  a.cols = C;
  auto out = [&](const QuantizedCopy& c) {
    Mxfp8Out o;
    o.data = c.data.ptr<uint8_t>();
    o.scales = opt.compact_scales ? c.scales.ptr<uint8_t>() : nullptr;
    o.swizzled = c.scales_swizzled.ptr<uint8_t>();
    o.amax = c.amax.ptr<float>();
    o.scale_inv = c.scale_inv.ptr<float>();
    o.padded_cols = num::padded_scale_cols(c.cols / 32);
    return o;
  };
  // MXFP8's amax (telemetry only: the scales are per block) is reduced by the encode pass whether or
  // not opt.amax_given; columnwise_amax alone rides on the rowwise pass (the row blocks of a tile
  // cover all of it), or on an amax pass when no copy is made.
  if (opt.rowwise) a.row = out(q.rowwise);
  if (opt.columnwise) a.col = out(q.columnwise);
  if (!opt.columnwise && opt.columnwise_amax) {
    if (!opt.rowwise) return launch_amax(st, x, R, C, nullptr, q.columnwise.amax.ptr<float>(), nullptr, what);
    a.col_amax_only = q.columnwise.amax.ptr<float>();
  }
  if (!opt.rowwise && !opt.columnwise) return;
  const unsigned grid = tile_grid(R, C, &a.tiles_c);
  mxfp8_encode_kernel<T><<<grid, kThreads, 0, st.stream>>>(x, a);
  check_launch(st, "quantize: mxfp8_encode_kernel", what);
}

template <typename T>
void quantize_fp8(const DeviceState& st, QuantizedTensor& q, const T* x, int64_t R, int64_t C,
                  const QuantizeOptions& opt, const std::string& what) {
  Fp8Args a;
  a.rows = R;
  a.cols = C;
  a.e4m3 = opt.format == QuantFormat::FP8_E4M3;
  auto out = [&](const QuantizedCopy& c, const char* which) {
    Fp8Out o;
    o.data = c.data.ptr<uint8_t>();
    o.amax = c.amax.ptr<float>();
    o.scale = opt.scale.data != nullptr ? opt.scale.ptr<float>() : nullptr;
    o.scale_inv = c.scale_inv.ptr<float>();
    return o;
  };
  if (opt.rowwise) a.row = out(q.rowwise, "rowwise");
  if (opt.columnwise) a.col = out(q.columnwise, "columnwise");
  // The columnwise copy holds the same values as the rowwise one: one plain amax serves both.
  float* plain0 = opt.rowwise && !opt.amax_given ? q.rowwise.amax.ptr<float>() : nullptr;
  float* plain1 = (opt.columnwise ? !opt.amax_given : opt.columnwise_amax) ? q.columnwise.amax.ptr<float>() : nullptr;
  // Delayed scaling's record of this step's amax rides on the same pass.
  float* record = opt.amax_record.data != nullptr ? opt.amax_record.ptr<float>() : nullptr;
  const bool copies = opt.rowwise || opt.columnwise;
  if (copies && opt.scale.data != nullptr && !st.reference_quantize_kernels) {
    // Delayed scaling: the encode pass reduces the amax itself (one read of x).
    a.amax0 = plain0;
    a.amax1 = plain1;
    a.record = plain0 != nullptr || plain1 != nullptr ? record : nullptr;
  } else if (plain0 != nullptr || plain1 != nullptr) {
    launch_amax(st, x, R, C, plain0, plain1, nullptr, what, record);
  }
  if (!copies) return;
  const unsigned grid = tile_grid(R, C, &a.tiles_c);
  fp8_encode_kernel<T><<<grid, kThreads, 0, st.stream>>>(x, a);
  check_launch(st, "quantize: fp8_encode_kernel", what);
}

template <typename T>
void quantize_typed(const DeviceState& st, QuantizedTensor& q, const T* x, int64_t R, int64_t C,
                    const QuantizeOptions& opt, const std::string& what) {
  switch (opt.format) {
    case QuantFormat::NVFP4: return quantize_nvfp4(st, q, x, R, C, opt, what);
    case QuantFormat::MXFP8: return quantize_mxfp8(st, q, x, R, C, opt, what);
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: return quantize_fp8(st, q, x, R, C, opt, what);
  }
}

}  // namespace

void quantize(const OpContext& ctx, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  if (opt.columnwise) q.columnwise_rht = opt.rht_columnwise;  // a rowwise-only call leaves the flag alone
  if (!opt.rowwise && !opt.columnwise && !opt.columnwise_amax) return;
  const std::string what = "x " + x.shape_str() + " -> " + quant_format_name(opt.format) +
                           (opt.rowwise ? " rowwise" : "") + (opt.columnwise ? " columnwise" : "") +
                           (opt.block_2d ? " 2d" : "") + (q.columnwise_rht ? " rht" : "") +
                           (opt.stochastic ? " sr" : "") + (opt.amax_given ? " (amax given)" : "") +
                           (opt.columnwise_amax && !opt.columnwise ? " (+ columnwise amax)" : "");
  if (x.dtype == DType::BF16)
    quantize_typed(*ctx.gpu, q, static_cast<const uint16_t*>(x.data), rows, cols, opt, what);
  else
    quantize_typed(*ctx.gpu, q, static_cast<const float*>(x.data), rows, cols, opt, what);
}

}  // namespace pl::cuda
