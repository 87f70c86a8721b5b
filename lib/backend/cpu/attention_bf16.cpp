// The CPU causal GQA attention with its products as BF16 GEMMs (oneDNN's matmul, onednn_gemm.h): the path
// attention.cpp takes when the activations are BF16 values and the GEMM engine is oneDNN BF16. Same
// algorithm as attention.cpp's FP32 path (flash-attention style: the forward saves the per-row log-sum-exp,
// the backward recomputes P from it; every output row has one owner), with the numerics of FlashAttention-2
// (Dao 2023, arXiv:2307.08691, Algorithms 1 and 2) and of cuDNN's BF16 SDPA, whose tensor-core GEMMs take
// BF16 operands:
//   forward   S = Q·Kᵀ (BF16 products, FP32 sums); x = S·scale, m = max x, p = e^(x − m), ℓ = Σ p, all FP32;
//             O = (BF16(p)·V) / ℓ — P rounded to BF16 for its GEMM, ℓ the FP32 sum of the unrounded p;
//             out = BF16(O), lse = m + log ℓ (FP32).
//   backward  P = e^(S·scale − lse), dP = dO·Vᵀ, dS = P∘(dP − D) in FP32 (D = dO·O from attention.cpp);
//             dQ = scale·BF16(dS)·K, dK = scale·BF16(dS)ᵀ·Q, dV = BF16(P)ᵀ·dO, each rounded to BF16 at the end.
// So P and dS carry one BF16 rounding (relative 2^-9) per term of the last GEMMs, where the FP32 path keeps
// them FP32 (tests/ops/test_attention.cpp states the resulting tolerances).
//
// Operands: qkv (and dout) hold BF16 values in FP32 storage; each call converts them once, exactly, into BF16
// copies laid out so that every GEMM operand is dense — oneDNN 2.6's native BF16 matmul (brgemm) takes only
// dense operands (a row stride other than the row length sends it to "gemm:jit", which the engine refuses):
// Q and dO as [B][kv head][S][query heads of the group][d], K and V as [B][kv head][S][d]. The query heads of
// a GQA group share K and V, so one GEMM serves the whole group: its rows are (position, head) pairs.
//
// Work items (OpenMP, dynamic schedule, largest first):
//   forward and dQ: (batch, kv head, tile of kTile query positions [i0, i1)) × the group's heads, against the
//                   keys [0, i1) only: fully masked key tiles are never computed; the causal mask is applied
//                   inside the diagonal tile (masked P and dS are exact zeros in the GEMM operands), and with
//                   documents (AttentionShape::docs) the keys before the query's document are masked the same
//                   way (their GEMM work is not skipped: the CPU path is the reference, not the fast one).
//   dK and dV:      (batch, kv head, tile of kTile key positions [j0, j1)), against the query positions
//                   [j0, S) of every head of the group (Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ recomputed transposed),
//                   in column chunks of kChunkTiles query tiles accumulated in FP32 (the matmul's sum).
// Thread-count independence: no output row is shared between items, and every thread sets its own OpenMP
// thread count to 1 inside the parallel regions, so each matmul primitive is created for one thread — the
// same primitive configuration (blocking, summation order) whatever --threads; tests check the bits.
//
// Scratch: the BF16 copies in the calling thread's thread_bf16_scratch<2>; per worker, the FP32 score blocks
// in thread_scratch<0> and the BF16 P/dS blocks in thread_bf16_scratch<3>. They only grow.
#include "backend/cpu/attention_bf16.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/onednn_gemm.h"
#include "backend/cpu/vector_clones.h"
#include "core/error.h"
#include "numerics/bf16.h"
#include "numerics/exp.h"

// The row kernels below are PL_VECTOR_CLONES (vector_clones.h): IEEE add, multiply, compare, conversion and
// integer operations only, so every clone gives the same bits.

namespace pl::cpu {
namespace {

constexpr int64_t kTile = 64;       // query positions per forward / dQ item, key positions per dK/dV item
constexpr int64_t kChunkTiles = 4;  // query tiles per dK/dV column chunk (bounds the score block of long S)
constexpr int kLanes = 16;          // fixed-order partial sums: the same result at every vector width

inline float lane_sum(const float* lane) {
  float l8[8];
  for (int k = 0; k < 8; ++k) l8[k] = lane[k] + lane[k + 8];
  return ((l8[0] + l8[4]) + (l8[1] + l8[5])) + ((l8[2] + l8[6]) + (l8[3] + l8[7]));
}

struct RowStats {
  float max, sum;
};

// One forward row of scores s[0, len) whose keys [lo, n) are visible (causal, within the query's document):
// s_j ← s_j·scale, m = max, p_j = e^(s_j − m), p16[j] = BF16(p_j) (exact zeros outside [lo, n)). Returns m and
// Σ p_j of the unrounded p (the masked p_j = 0 added in their lanes: exact, so lo = 0 is the plain causal row).
PL_VECTOR_CLONES RowStats softmax_row(float* s, int64_t lo, int64_t n, int64_t len, float scale, uint16_t* p16) {
  float lane[kLanes];
  for (int k = 0; k < kLanes; ++k) lane[k] = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < lo; ++j) s[j] = -std::numeric_limits<float>::infinity();
  for (int64_t j = lo; j < n; ++j) s[j] *= scale;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] = s[j + k] > lane[k] ? s[j + k] : lane[k];
  for (int k = 0; j < n; ++j, ++k) lane[k] = s[j] > lane[k] ? s[j] : lane[k];
  float m = lane[0];
  for (int k = 1; k < kLanes; ++k) m = lane[k] > m ? lane[k] : m;
  for (j = 0; j < lo; ++j) s[j] = 0.0f;
  for (j = lo; j < n; ++j) s[j] = num::exp_f32(s[j] - m);
  for (int k = 0; k < kLanes; ++k) lane[k] = 0.0f;
  for (j = 0; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += s[j + k];
  for (int k = 0; j < n; ++j, ++k) lane[k] += s[j];
  for (j = 0; j < n; ++j) p16[j] = num::float_to_bf16_bits(s[j]);
  for (j = n; j < len; ++j) p16[j] = 0;
  return {m, lane_sum(lane)};
}

// A dQ row (one query, keys [lo, n) visible of [0, len)): ds16[j] = BF16(p_j·(dp_j − D)), p_j = e^(s_j·scale − lse);
// zeros outside [lo, n).
PL_VECTOR_CLONES void dq_row(const float* s, const float* dp, int64_t lo, int64_t n, int64_t len, float scale, float lse,
                          float D, uint16_t* ds16) {
  for (int64_t j = 0; j < lo; ++j) ds16[j] = 0;
  for (int64_t j = lo; j < n; ++j) {
    const float p = num::exp_f32(s[j] * scale - lse);
    ds16[j] = num::float_to_bf16_bits(p * (dp[j] - D));
  }
  for (int64_t j = n; j < len; ++j) ds16[j] = 0;
}

// A dK/dV row (one key; columns c are queries, visible in [c0, c1): causal from c0 on, within the key's document
// before c1; each with its lse[c] and D[c]): p16[c] = BF16(p_c), ds16[c] = BF16(p_c·(dp_c − D[c])),
// p_c = e^(s_c·scale − lse[c]); zeros outside [c0, c1).
PL_VECTOR_CLONES void dkdv_row(const float* s, const float* dp, int64_t c0, int64_t c1, int64_t len, float scale,
                            const float* lse, const float* D, uint16_t* p16, uint16_t* ds16) {
  for (int64_t c = 0; c < c0; ++c) p16[c] = ds16[c] = 0;
  for (int64_t c = std::max(c0, c1); c < len; ++c) p16[c] = ds16[c] = 0;
  for (int64_t c = c0; c < c1; ++c) {
    const float p = num::exp_f32(s[c] * scale - lse[c]);
    p16[c] = num::float_to_bf16_bits(p);
    ds16[c] = num::float_to_bf16_bits(p * (dp[c] - D[c]));
  }
}

// c[M,N] (dense, N = lb.cols) = A·B (+ c when accumulate), BF16 operands, FP32 sums: oneDNN's BF16 matmul,
// its native kernel or, for a tile shape it has none for, whatever implementation it picked (the operands
// exist only in BF16 here; this path runs only on the oneDNN engine, so the call cannot decline).
void tile_matmul(const char* op, const uint16_t* a, const MatLayout& la, const uint16_t* b, const MatLayout& lb,
                 float* c, bool accumulate) {
  PL_CHECK(onednn_bf16_matmul(op, a, la, b, lb, c, lb.cols, 1.0f, accumulate, false),
           "{}: the BF16-GEMM attention path ran without the oneDNN engine", op);
}

// dst[e] = BF16 value of y[e]·a, as FP32 storage (the op's BF16 outputs).
inline void scale_round_into(float* dst, const float* y, float a, int64_t n) {
  for (int64_t e = 0; e < n; ++e) dst[e] = num::round_bf16(y[e] * a);
}

// The BF16 copies of one call's operands and the shapes to address them.
struct Bf16Attention {
  int64_t B, S, nq, nkv, d, group, width;  // width: the row length of qkv, (nq + 2·nkv)·d
  float scale;
  const uint16_t *q, *k, *v, *dO;  // q, dO: [B·nkv][S·group][d]; k, v: [B·nkv][S][d]
  DocumentSpans docs;              // the visible keys of each query and queries of each key
  int64_t tiles() const { return (S + kTile - 1) / kTile; }
  const uint16_t* q_rows(int64_t bg, int64_t i) const { return q + (bg * S + i) * group * d; }
  const uint16_t* dO_rows(int64_t bg, int64_t i) const { return dO + (bg * S + i) * group * d; }
  const uint16_t* k_rows(int64_t bg, int64_t j) const { return k + (bg * S + j) * d; }
  const uint16_t* v_rows(int64_t bg, int64_t j) const { return v + (bg * S + j) * d; }
  // Element offsets in the FP32 tensors: row (b, i) of query head h in out / dout; of q, k, v in qkv.
  int64_t out_at(int64_t b, int64_t i, int64_t h) const { return (b * S + i) * nq * d + h * d; }
  int64_t q_at(int64_t b, int64_t i, int64_t h) const { return (b * S + i) * width + h * d; }
  int64_t k_at(int64_t b, int64_t j, int64_t g) const { return (b * S + j) * width + (nq + g) * d; }
  int64_t v_at(int64_t b, int64_t j, int64_t g) const { return (b * S + j) * width + (nq + nkv + g) * d; }
  int64_t lse_at(int64_t b, int64_t h, int64_t i) const { return (b * nq + h) * S + i; }
  // One worker's scratch: two FP32 score blocks (S and dP, or their transposes) of up to kTile·group rows by
  // cols() columns, two [kTile·group, d] FP32 results, two FP32 vectors of cols(); BF16 P and dS blocks.
  int64_t cols() const { return std::max(S, kChunkTiles * kTile * group); }  // >= S and >= a dK/dV chunk
  struct Scratch {
    float *s, *dp, *res1, *res2, *vec1, *vec2;
    uint16_t *p16, *ds16;
  };
  Scratch scratch() const {
    const int64_t block = kTile * group * cols(), res = kTile * group * d;
    float* f = thread_scratch<0>(static_cast<size_t>(2 * block + 2 * res + 2 * cols()));
    uint16_t* h = thread_bf16_scratch<3>(static_cast<size_t>(2 * block));
    return {f, f + block, f + 2 * block, f + 2 * block + res, f + 2 * block + 2 * res, f + 2 * block + 2 * res + cols(),
            h, h + block};
  }

  Bf16Attention(const AttentionShape& s, const DocumentSpans& spans, const float* qkv, const float* dout);
  void forward_item(int64_t bg, int64_t t, float* out, float* lse) const;
  void dq_item(int64_t bg, int64_t t, const float* lse, const float* D, float* dx) const;
  void dkdv_item(int64_t bg, int64_t t, const float* lse, const float* D, float* dx) const;
};

// Converts qkv (and dout, when given) into the grouped BF16 layout: exact, the inputs hold BF16 values.
Bf16Attention::Bf16Attention(const AttentionShape& s, const DocumentSpans& spans, const float* qkv, const float* dout)
    : B(s.batch), S(s.seq), nq(s.q_heads), nkv(s.kv_heads), d(s.head_dim), group(s.q_heads / s.kv_heads),
      width((s.q_heads + 2 * s.kv_heads) * s.head_dim), scale(1.0f / std::sqrt(static_cast<float>(s.head_dim))) {
  const int64_t per_q = B * S * nq * d, per_kv = B * S * nkv * d;
  uint16_t* buf = thread_bf16_scratch<2>(static_cast<size_t>(per_q * (dout ? 2 : 1) + 2 * per_kv));
  uint16_t *qb = buf, *kb = qb + per_q, *vb = kb + per_kv, *gb = dout ? vb + per_kv : nullptr;
  q = qb, k = kb, v = vb, dO = gb;
  docs = spans;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < nkv; ++g) {
      const int64_t bg = b * nkv + g;
      // The group's query heads are adjacent in a qkv row: one row of group·d values per position.
      to_bf16_rows(qb + bg * S * group * d, qkv + q_at(b, 0, g * group), S, group * d, width);
      to_bf16_rows(kb + bg * S * d, qkv + k_at(b, 0, g), S, d, width);
      to_bf16_rows(vb + bg * S * d, qkv + v_at(b, 0, g), S, d, width);
      if (dout) to_bf16_rows(gb + bg * S * group * d, dout + out_at(b, 0, g * group), S, group * d, nq * d);
    }
}

// Query positions [i0, i1) of the heads of kv head g: O = BF16(P)·V[0, i1) over keys [0, i1).
void Bf16Attention::forward_item(int64_t bg, int64_t t, float* out, float* lse) const {
  const int64_t b = bg / nkv, g = bg % nkv, i0 = t * kTile, i1 = std::min(S, i0 + kTile), M = (i1 - i0) * group;
  const Scratch w = scratch();
  float *s = w.s, *o = w.res1, *row_max = w.vec1, *row_sum = w.vec2;  // M <= kTile·group <= cols()
  tile_matmul("attention_forward", q_rows(bg, i0), row_major(M, d, d), k_rows(bg, 0), transposed(i1, d, d), s, false);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t i = i0 + r / group;
    const RowStats st = softmax_row(s + r * i1, docs.lo(b, i), i + 1, i1, scale, w.p16 + r * i1);
    row_max[r] = st.max;
    row_sum[r] = st.sum;
  }
  tile_matmul("attention_forward", w.p16, row_major(M, i1, i1), v_rows(bg, 0), row_major(i1, d, d), o, false);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t i = i0 + r / group, h = g * group + r % group;
    scale_round_into(out + out_at(b, i, h), o + r * d, 1.0f / row_sum[r], d);
    lse[lse_at(b, h, i)] = row_max[r] + std::log(row_sum[r]);
  }
}

// dQ of query positions [i0, i1) of the heads of kv head g, over keys [0, i1).
void Bf16Attention::dq_item(int64_t bg, int64_t t, const float* lse, const float* D, float* dx) const {
  const int64_t b = bg / nkv, g = bg % nkv, i0 = t * kTile, i1 = std::min(S, i0 + kTile), M = (i1 - i0) * group;
  const Scratch w = scratch();
  const char* op = "attention_backward";
  tile_matmul(op, q_rows(bg, i0), row_major(M, d, d), k_rows(bg, 0), transposed(i1, d, d), w.s, false);
  tile_matmul(op, dO_rows(bg, i0), row_major(M, d, d), v_rows(bg, 0), transposed(i1, d, d), w.dp, false);
  for (int64_t r = 0; r < M; ++r) {
    const int64_t i = i0 + r / group, at = lse_at(b, g * group + r % group, i);
    dq_row(w.s + r * i1, w.dp + r * i1, docs.lo(b, i), i + 1, i1, scale, lse[at], D[at], w.ds16 + r * i1);
  }
  tile_matmul(op, w.ds16, row_major(M, i1, i1), k_rows(bg, 0), row_major(i1, d, d), w.res1, false);
  for (int64_t r = 0; r < M; ++r)
    scale_round_into(dx + q_at(b, i0 + r / group, g * group + r % group), w.res1 + r * d, scale, d);
}

// dK and dV of key positions [j0, j1) of kv head g, over query positions [j0, S) of the group's heads, in column
// chunks [p0, p1) of kChunkTiles query tiles; a column is a (position, head) pair, as a row of q_rows.
void Bf16Attention::dkdv_item(int64_t bg, int64_t t, const float* lse, const float* D, float* dx) const {
  const int64_t b = bg / nkv, g = bg % nkv, j0 = t * kTile, j1 = std::min(S, j0 + kTile), M = j1 - j0;
  const Scratch w = scratch();
  float *dk = w.res1, *dv = w.res2, *lse_c = w.vec1, *D_c = w.vec2;
  const char* op = "attention_backward";
  for (int64_t p0 = j0; p0 < S; p0 += kChunkTiles * kTile) {
    const int64_t p1 = std::min(S, p0 + kChunkTiles * kTile), N = (p1 - p0) * group;
    for (int64_t c = 0; c < N; ++c) {
      const int64_t at = lse_at(b, g * group + c % group, p0 + c / group);
      lse_c[c] = lse[at];
      D_c[c] = D[at];
    }
    tile_matmul(op, k_rows(bg, j0), row_major(M, d, d), q_rows(bg, p0), transposed(N, d, d), w.s, false);
    tile_matmul(op, v_rows(bg, j0), row_major(M, d, d), dO_rows(bg, p0), transposed(N, d, d), w.dp, false);
    for (int64_t r = 0; r < M; ++r) {
      const int64_t c0 = std::max<int64_t>(0, (j0 + r - p0) * group);  // queries before key j0 + r are masked
      const int64_t c1 = std::clamp<int64_t>((docs.hi(b, j0 + r) - p0) * group, 0, N);  // and those after its document
      dkdv_row(w.s + r * N, w.dp + r * N, c0, c1, N, scale, lse_c, D_c, w.p16 + r * N, w.ds16 + r * N);
    }
    const bool acc = p0 > j0;
    tile_matmul(op, w.p16, row_major(M, N, N), dO_rows(bg, p0), row_major(N, d, d), dv, acc);
    tile_matmul(op, w.ds16, row_major(M, N, N), q_rows(bg, p0), row_major(N, d, d), dk, acc);
  }
  for (int64_t r = 0; r < M; ++r) {
    scale_round_into(dx + k_at(b, j0 + r, g), dk + r * d, scale, d);
    scale_round_into(dx + v_at(b, j0 + r, g), dv + r * d, 1.0f, d);
  }
}

// Runs item(bg, t) for every (batch·kv head, tile), largest items first when heavy_last (the forward's and
// dQ's cost grows with t). Each thread's OpenMP thread count is 1 inside the region: the matmul primitives
// are then created for one thread whatever the team size (see the header comment).
template <class Item>
void for_each_item(int64_t BG, int64_t tiles, bool heavy_last, const Item& item) {
#pragma omp parallel
  {
    omp_set_num_threads(1);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t bg = 0; bg < BG; ++bg)
      for (int64_t u = 0; u < tiles; ++u) item(bg, heavy_last ? tiles - 1 - u : u);
  }
}

}  // namespace

bool attention_bf16_path(const OpContext& ctx) { return ctx.round_bf16 && cpu_gemm_engine().onednn_bf16; }

void attention_forward_bf16(const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionShape& s,
                            const DocumentSpans& docs) {
  const Bf16Attention a(s, docs, qkv.f32(), nullptr);
  float *o = out.f32(), *l = lse.f32();
  for_each_item(a.B * a.nkv, a.tiles(), true, [&](int64_t bg, int64_t t) { a.forward_item(bg, t, o, l); });
}

void attention_backward_bf16(const Tensor& dqkv, const Tensor& dout, const Tensor& lse, const Tensor& qkv,
                             const AttentionShape& s, const DocumentSpans& docs, const float* D) {
  const Bf16Attention a(s, docs, qkv.f32(), dout.f32());
  const float* l = lse.f32();
  float* dx = dqkv.f32();
  for_each_item(a.B * a.nkv, a.tiles(), true, [&](int64_t bg, int64_t t) { a.dq_item(bg, t, l, D, dx); });
  for_each_item(a.B * a.nkv, a.tiles(), false, [&](int64_t bg, int64_t t) { a.dkdv_item(bg, t, l, D, dx); });
}

}  // namespace pl::cpu
