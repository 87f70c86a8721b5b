#pragma once
// The CPU quantizers' inner kernels (quantize_tile.cpp), vectorized over blocks: a BlockGroup is up to
// kLanes blocks of one copy, loaded into a small structure-of-arrays tile T[element][lane] so that
// every step (RHT butterfly, block amax, scale, encode, Philox) is a loop over the lanes the compiler
// turns into SIMD. quantize.cpp schedules the groups over threads. Results are byte-identical to the
// per-block numerics of lib/numerics/ (quantize_simd.h holds the branch-free twins they use).
#include <cstdint>

#include "backend/cpu/quantize_common.h"

namespace pl::cpu {

constexpr int kLanes = 16;

// Up to kLanes blocks of E consecutive copy elements; lane j is block (row0 + j*row_step,
// block0 + j*block_step) of the copy (one of the steps is 0).
struct BlockGroup {
  int64_t x_off = 0;        // x offset of lane 0's first element
  int64_t elem_stride = 1;  // x offset between consecutive elements of a block
  int64_t lane_stride = 1;  // x offset between lanes' first elements
  int lanes = kLanes;
  int64_t row0 = 0, block0 = 0;
  int row_step = 0, block_step = 0;
};

// The group of `lanes` blocks of `elems` elements starting at copy block (r0, b0) of source s, lanes
// advancing along copy rows (along_rows) or along blocks of one row.
BlockGroup make_group(const Source& s, int64_t r0, int64_t b0, int lanes, bool along_rows, int elems);

// What an NVFP4 group encode needs besides its source: the tensor's scales and the SR stream.
struct Nvfp4Params {
  float s_enc = 1.0f, s_dec = 1.0f, mult = 0.0f;  // nvfp4.h: S_enc, S_dec, S_enc * f32(1/6)
  bool rht = false;         // the group's blocks are RHT'd first
  bool tile_2d = false;     // one scale for the whole group (a 16x16 tile), RN
  bool stochastic = false;  // SR with the Philox stream below (1x16 only)
  uint64_t seed = 0, counter = 0;
  uint32_t stream = 0;
  int64_t cols = 0;  // copy columns
};

// max |v| (NaN ignored) over the group's values, RHT'd when rht.
float group_amax(const float* x, const BlockGroup& g, bool rht);
// max |x[i]| (NaN ignored) over n contiguous values.
float contiguous_amax(const float* x, int64_t n);
// Codes and scales of the group's blocks (NVFP4 1x16 or one 16x16 tile; MXFP8 1x32).
void nvfp4_group(const float* x, const BlockGroup& g, const Nvfp4Params& p, uint8_t* data, uint8_t* scales);
void mxfp8_group(const float* x, const BlockGroup& g, int64_t cols, uint8_t* data, uint8_t* scales);
// FP8 per-tensor codes of copy rows r0 .. r0+rows-1 (rows <= kLanes; `cols` per row).
void fp8_rows(const Source& s, int64_t r0, int rows, int64_t cols, float scale, bool e4m3, uint8_t* data);

}  // namespace pl::cpu
