// CUDA quantizers (backend/quantize.h: quantize): NVFP4 (1x16 RN or SR, 16x16 tiles, RHT'd
// columnwise copy), MXFP8 and FP8 per-tensor current scaling, bit-identical with the CPU reference
// (backend/cpu/quantize.cpp): every scale and code comes from the same lib/numerics/ functions on
// the same float values, and the only cross-thread reductions are maxima (order-independent).
//
// Schedule, all on the device state's compute stream with no host round trip:
//   (no memsets: the amax slots are stored by the last block of the pass that reduces them,
//   combine_amax, and the padding of the swizzled scale arrays is zeroed by the encode pass)
//   1. amax pass (NVFP4, FP8): a grid-stride max of |x| (and, for an RHT'd columnwise copy, of the
//      RHT outputs, computed in the same pass over x), reduced per block and combined across blocks
//      by combine_amax into the copies' amax slots;
//   2. encode pass: one block per 64x64 tile of x, staged through shared memory; each thread makes
//      one 16-block (NVFP4), 32-block (MXFP8) or 16-element run (FP8) of the rowwise copy from a
//      tile row and one of the columnwise copy from a tile column, reading the global scale from the
//      amax slot on the device, and writes codes, compact scales and swizzled scales directly.
//      MXFP8 needs no global scale, so its amax is reduced inside the encode pass (one pass over x).
//      NVFP4 (S_enc) and FP8 per tensor (scale) need the whole tensor's amax before the first code, so
//      their amax pass stays separate. Round-to-nearest codes come from the cvt instructions where the
//      architecture has them (qk::cvt_fp8x2 / cvt_e2m1x2, quantize_common.cuh), the same bits as the
//      shared numerics; stochastic rounding stays on the shared Philox rule.
// The encode pass makes both copies from one read of x (x is read twice in all for NVFP4 and FP8:
// amax, then encode). Fusion points for later (shared PERF-NOTES): a producer kernel may compute the
// amax into the slots itself and leave only the encode pass. num::rht16 uses no FP64: an FP32
// butterfly for typical chunks, exact integer paths (int64, rarely 288-bit in local memory) otherwise.
#include <cuda_runtime.h>

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

// ---- combining the per-block maxima of one launch ----------------------------------------------------
// The blocks of a launch atomicMax their maxima (non-negative floats, whose bits order as unsigned
// integers) into partial[]; the last block to finish (counted in blocks_done, after a __threadfence, as
// the CUDA programming guide's "last block" reduction) takes them with atomicExch, which also zeroes them,
// stores them into the amax slots and zeroes the count. So the set is zero between launches (module load
// zeroes it), the slots need no cudaMemsetAsync before the launch, and each slot gets the exact max of
// every value offered, as a direct atomicMax into a zeroed slot gave. One set per kernel that uses it:
// its launches are ordered on the device state's compute stream (a second device state quantizing on the
// same GPU concurrently would need its own sets).
struct AmaxCombine {
  unsigned int partial[2];
  unsigned int blocks_done;
};
__device__ AmaxCombine g_amax_pass_combine;   // amax_kernel
__device__ AmaxCombine g_mxfp8_amax_combine;  // mxfp8_encode_kernel

// Thread 0 of every block: m into d0, d1, d2 and m1 into e0 (null slots skipped).
__device__ void combine_amax(AmaxCombine& c, float m, float* d0, float* d1, float* d2, float m1, float* e0) {
  if (d0 != nullptr || d1 != nullptr || d2 != nullptr) atomicMax(&c.partial[0], __float_as_uint(m));
  if (e0 != nullptr) atomicMax(&c.partial[1], __float_as_uint(m1));
  __threadfence();  // the maxima above are visible device-wide before this block is counted
  if (atomicAdd(&c.blocks_done, 1u) != gridDim.x - 1) return;
  __threadfence();
  const float all = __uint_as_float(atomicExch(&c.partial[0], 0u));
  const float all1 = __uint_as_float(atomicExch(&c.partial[1], 0u));
  if (d0 != nullptr) *d0 = all;
  if (d1 != nullptr) *d1 = all;
  if (d2 != nullptr) *d2 = all;
  if (e0 != nullptr) *e0 = all1;
  atomicExch(&c.blocks_done, 0u);
}

// ---- amax pass -------------------------------------------------------------------------------------
// plain0/plain1 (may be null): max |x| over x[R, C]. rht (may be null; then R % 16 == 0): max |y| over
// the RHT outputs y = rht16(x[16g .. 16g+15][c]) for every 16-row group g and column c, i.e. over
// RHT(xᵀ) as the columnwise copy sees it. record (may be null; only with plain0 or plain1): the plain amax
// once more (delayed scaling's history entry). The slots are written by the last block (combine_amax).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* __restrict__ x, int64_t R, int64_t C, float* plain0, float* plain1, float* rht, float* record) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float m = 0.0f, mr = 0.0f;
  if (rht == nullptr) {
    const int64_t n = R * C;
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
  } else {
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
  }
  m = qk::block_max(m);
  if (rht != nullptr) mr = qk::block_max(mr);
  if (threadIdx.x == 0) combine_amax(g_amax_pass_combine, m, plain0, plain1, record, mr, rht);
}

// ---- padding of the swizzled scale arrays -----------------------------------------------------------
// Zeroes the padding of a swizzled scale array (num::padded_scale_rows(rows) x pc bytes, of which rows x nb
// are scales) in copy rows [r_lo, r_hi): the columns nb..pc of real rows and every column of padding rows.
// Called by all threads of the encode block that owns the last tile of those copy rows (pad_swizzled), so
// the pass that writes the scales writes every padding byte too: no cudaMemsetAsync before it.
__device__ void zero_scale_padding(uint8_t* swz, int64_t rows, int64_t nb, int64_t pc, int64_t r_lo, int64_t r_hi) {
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
__device__ void pad_swizzled(uint8_t* row_swz, int64_t row_pc, uint8_t* col_swz, int64_t col_pc, int64_t R,
                             int64_t C, int64_t r0, int64_t c0, int64_t block) {
  const bool last_r = r0 + kTile >= R, last_c = c0 + kTile >= C;
  if (row_swz != nullptr && last_c)
    zero_scale_padding(row_swz, R, C / block, row_pc, r0, last_r ? num::padded_scale_rows(R) : r0 + kTile);
  if (col_swz != nullptr && last_r)
    zero_scale_padding(col_swz, C, R / block, col_pc, c0, last_c ? num::padded_scale_rows(C) : c0 + kTile);
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
template <typename T>
__global__ void __launch_bounds__(kThreads) nvfp4_encode_kernel(const T* __restrict__ x, Nvfp4Args a) {
  __shared__ float s[kTile][kTileLd];
  __shared__ float tile_amax[kTile / 16][kTile / 16];
  const int64_t tile = blockIdx.x;
  const int64_t r0 = tile / a.tiles_c * kTile, c0 = tile % a.tiles_c * kTile;
  qk::load_tile(s, x, a.rows, a.cols, r0, c0);
  pad_swizzled(a.row.data != nullptr ? a.row.swizzled : nullptr, a.row.padded_cols,
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
      if (a.rht) num::rht16(v, v, num::kRhtSignMask);
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
  pad_swizzled(a.row.data != nullptr ? a.row.swizzled : nullptr, a.row.padded_cols,
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
    combine_amax(g_mxfp8_amax_combine, m, a.row.data != nullptr ? a.row.amax : nullptr,
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
};

__device__ __forceinline__ void fp8_encode_run(const float (&v)[16], int n, float scale, bool e4m3, uint8_t* dst) {
  uint8_t code[16];
  for (int k = 0; k < 8; ++k) {  // num::float_to_e4m3 / e5m2(v * scale), two at a time
    const float lo = v[2 * k] * scale, hi = v[2 * k + 1] * scale;
    const uint16_t d = e4m3 ? qk::cvt_fp8x2<true>(lo, hi) : qk::cvt_fp8x2<false>(lo, hi);
    code[2 * k] = static_cast<uint8_t>(d & 0xFFu);
    code[2 * k + 1] = static_cast<uint8_t>(d >> 8);
  }
  if (n == 16) {
    qk::store_bytes(dst, code);
  } else {
    for (int k = 0; k < n; ++k) dst[k] = code[k];
  }
}

// The scale of a copy: delayed scaling's given one, else current scaling's from the copy's amax.
__device__ __forceinline__ float fp8_scale(const Fp8Out& o, float fmax) {
  return o.scale != nullptr ? *o.scale : num::fp8_current_scale(*o.amax, fmax);
}

// One block per 64x64 tile; thread t: rowwise, 16 columns 16(t%4).. of tile row t/4; columnwise,
// 16 rows 16(t%4).. of tile column t/4 (clipped at the edges of x).
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
  if (a.row.data != nullptr) {
    const int64_t r = r0 + q, c = c0 + 16 * seg;
    if (r < a.rows && c < a.cols) {
      const float scale = fp8_scale(a.row, fmax);
      float v[16];
      for (int k = 0; k < 16; ++k) v[k] = s[q][16 * seg + k];
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
      const int n = a.rows - r < 16 ? static_cast<int>(a.rows - r) : 16;
      fp8_encode_run(v, n, scale, a.e4m3, a.col.data + c * a.rows + r);
    }
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
  const int64_t items = rht != nullptr ? (R / 16) * C : (R * C + 7) / 8;
  amax_kernel<T>
      <<<qk::grid_stride_blocks(items, kThreads, st.num_sms), kThreads, 0, st.stream>>>(x, R, C, plain0, plain1, rht,
                                                                                     record);
  check_launch(st, "quantize: amax_kernel", what + (rht != nullptr ? " (with RHT)" : ""));
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
  if (plain0 != nullptr || plain1 != nullptr || rht != nullptr) launch_amax(st, x, R, C, plain0, plain1, rht, what);
  if (!opt.rowwise && !opt.columnwise) return;
  const unsigned grid = tile_grid(R, C, &a.tiles_c);
  nvfp4_encode_kernel<T><<<grid, kThreads, 0, st.stream>>>(x, a);
  check_launch(st, "quantize: nvfp4_encode_kernel", what);
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
  if (plain0 != nullptr || plain1 != nullptr) launch_amax(st, x, R, C, plain0, plain1, nullptr, what, record);
  if (!opt.rowwise && !opt.columnwise) return;
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

// ---- FP8 delayed scaling's update ------------------------------------------------------------------
// One thread per tensor (history column), the shared num::delayed_scaling_update_one: the CPU's bits.
__global__ void __launch_bounds__(kThreads)
    delayed_scaling_update_kernel(float* history, float* scale, int64_t len, int64_t n, DelayedScalingRule rule) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  num::delayed_scaling_update_one(history, len, n, j, scale + j, rule.most_recent,
                                  j < rule.num_forward ? rule.forward_scaled_max : rule.backward_scaled_max);
}

void delayed_scaling_update(const OpContext& ctx, const Tensor& history, const Tensor& scale,
                            const DelayedScalingRule& rule) {
  const int64_t len = history.dim(0), n = history.dim(1);
  if (n == 0) return;
  const DeviceState& st = *ctx.gpu;
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  delayed_scaling_update_kernel<<<blocks, kThreads, 0, st.stream>>>(history.ptr<float>(), scale.ptr<float>(), len, n,
                                                                    rule);
  check_launch(st, "delayed_scaling_update: delayed_scaling_update_kernel", "history " + history.shape_str());
}

}  // namespace pl::cuda
