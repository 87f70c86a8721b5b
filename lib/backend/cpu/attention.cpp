// CPU causal grouped-query attention, flash-attention style: the forward saves only the per-row
// log-sum-exp, the backward recomputes the probabilities from it.
//
// Two paths. With BF16 activations (ctx.round_bf16) on a CPU whose GEMM engine is oneDNN BF16, the products
// run as BF16 GEMMs by tile, P and dS rounded to BF16 for them as cuDNN does: attention_bf16.cpp (D below is
// shared). Otherwise (the plain-FP32 model of the finite-difference tests, or the FP32 BLAS engine) this file's
// FP32 path, which keeps P and dS in FP32:
//
// Forward, per query row i of a (batch, query head): scores s_j = q_i·k_j / sqrt(d) for j <= i in
// fp32, softmax in fp32 (max-subtracted, fp32 sum), out_i = Σ_j p_j v_j, lse_i = max + log Σ exp(s_j - max).
//
// Backward, with D_i = dO_i·O_i, P_ij = exp(s_ij - lse_i), dP_ij = dO_i·v_j, dS_ij = P_ij (dP_ij - D_i):
//   pass 1, per (b, query head, query row i):  dq_i = scale Σ_{j<=i} dS_ij k_j
//   pass 2, per (b, kv head, key row j):       dk_j = scale Σ_{heads of the group} Σ_{i>=j} dS_ij q_i
//                                              dv_j =       Σ_{heads of the group} Σ_{i>=j} P_ij dO_i
// With documents (AttentionShape::docs, --reset-attention-mask) the sums run over the query's document only:
// j from its first position lo(i) (not 0) in pass 1 and the forward, i up to its end hi(j) (not S) in pass 2.
// The terms and their grouping are those of the document run as a sample of its own, so the result equals
// that run's bit for bit (tests/ops/test_attention_documents.cpp).
// Every output row is owned by one work item, so there are no atomics, results do not depend on the
// thread count, and dqkv is fully overwritten. The price is recomputing P and dP in both passes.
//
// Parallelism: OpenMP over work items of kRowBlock rows of one (batch, head), dynamic schedule since
// causal rows differ in length. Each item first packs the k/v (or q/dO) rows it reads into a
// contiguous per-thread copy (qkv rows are usually a multiple of 4 KiB apart, which thrashes L1).
//
// Scratch: per thread, a thread_local vector of (2d + 1)·S floats (packed rows and one row of
// scores); for the backward, D ([B, nq, S] fp32) in a thread_local vector of the calling thread.
// They only grow, so steady-state calls do not allocate.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/attention_bf16.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "numerics/bf16.h"

namespace pl::cpu {
namespace {
// Addresses inside a [B*S, (nq+2nkv)*d] qkv-shaped row-major buffer.
struct QkvLayout {
  int64_t S, nq, nkv, d, width;
  int64_t row(int64_t b, int64_t i) const { return (b * S + i) * width; }
  int64_t q(int64_t b, int64_t i, int64_t h) const { return row(b, i) + h * d; }
  int64_t k(int64_t b, int64_t j, int64_t g) const { return row(b, j) + (nq + g) * d; }
  int64_t v(int64_t b, int64_t j, int64_t g) const { return row(b, j) + (nq + nkv + g) * d; }
};

// Dot product over one head (n = head_dim) in eight interleaved fp32 lanes (element e goes to lane
// e % 8) added in a fixed order: the compiler vectorizes it without reassociating, so the result does
// not depend on the build's vector width.
inline float dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {};
  int64_t e = 0;
  for (; e + 8 <= n; e += 8)
    for (int k = 0; k < 8; ++k) lane[k] += a[e + k] * b[e + k];
  for (int k = 0; e < n; ++e, ++k) lane[k] += a[e] * b[e];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// y += Σ_{u<m} a[u] x_u over m <= 4 rows x_u = x + u * n (contiguous, packed). Four rows per pass
// over y cut its loads and stores by four; the summation order is fixed.
inline void axpy_rows(float* y, const float* a, const float* x, int64_t m, int64_t n) {
  if (m == 4) {
    const float *x0 = x, *x1 = x + n, *x2 = x + 2 * n, *x3 = x + 3 * n;
    const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    for (int64_t e = 0; e < n; ++e) y[e] += (a0 * x0[e] + a1 * x1[e]) + (a2 * x2[e] + a3 * x3[e]);
    return;
  }
  for (int64_t u = 0; u < m; ++u)
    for (int64_t e = 0; e < n; ++e) y[e] += a[u] * x[u * n + e];
}

inline void scale_round(float* y, float a, int64_t n, bool round) {
  for (int64_t e = 0; e < n; ++e) {
    const float v = y[e] * a;
    y[e] = round ? num::round_bf16(v) : v;
  }
}

// Copies rows [r0, r1) of one head (rows `stride` floats apart, head_dim n) into dst, contiguous.
// Rows of qkv are often a multiple of 4 KiB apart, which maps the rows of one head onto the same L1
// sets; working on a packed copy keeps them in cache.
inline void pack_rows(float* dst, const float* src, int64_t stride, int64_t r0, int64_t r1, int64_t n) {
  for (int64_t r = r0; r < r1; ++r) std::copy(src + r * stride, src + r * stride + n, dst + (r - r0) * n);
}

constexpr int64_t kRowBlock = 64;  // query rows (forward, dq) or key rows (dk, dv) per work item

// The backward's operands, read by the work items of both passes (every output row has one owner).
struct AttentionBackward {
  QkvLayout L;
  int64_t S, nq, nkv, d, group;
  int64_t ostride;  // row stride of out / dout
  float scale;
  const float *x, *go, *l;
  const float* D;  // [B, nq, S]: dO_i · O_i
  float* dx;
  bool round;
  DocumentSpans docs;

  // Pass 1, per (batch, query head, block of query rows): dq_i = scale Σ_{j<=i} dS_ij k_j.
  void dq_block(int64_t bh, int64_t blk) const {
    const int64_t b = bh / nq, h = bh % nq, g = h / group;
    const int64_t i0 = blk * kRowBlock, i1 = std::min(S, i0 + kRowBlock);
    float* kp = thread_scratch<0>(static_cast<size_t>(2 * d * S));
    float* vp = kp + S * d;
    pack_rows(kp, x + L.k(b, 0, g), L.width, 0, i1, d);
    pack_rows(vp, x + L.v(b, 0, g), L.width, 0, i1, d);
    for (int64_t i = i0; i < i1; ++i) {
      const float* q = x + L.q(b, i, h);
      const float* gi = go + (b * S + i) * ostride + h * d;
      const float li = l[bh * S + i], Di = D[bh * S + i];
      float* dq = dx + L.q(b, i, h);
      for (int64_t c = 0; c < d; ++c) dq[c] = 0.0f;
      for (int64_t j0 = docs.lo(b, i); j0 <= i; j0 += 4) {
        const int64_t m = std::min<int64_t>(4, i + 1 - j0);
        float ds[4];
        for (int64_t u = 0; u < m; ++u) {
          const float* k = kp + (j0 + u) * d;
          const float p = std::exp(dot(q, k, d) * scale - li);
          ds[u] = p * (dot(gi, vp + (j0 + u) * d, d) - Di);
        }
        axpy_rows(dq, ds, kp + j0 * d, m, d);
      }
      scale_round(dq, scale, d, round);
    }
  }

  // Pass 2, per (batch, kv head, block of key rows [j0, j1)), over the query heads of the group and
  // the query rows i >= j:  dk_j = scale Σ dS_ij q_i,  dv_j = Σ P_ij dO_i.
  void dkdv_block(int64_t bg, int64_t blk) const {
    const int64_t b = bg / nkv, g = bg % nkv;
    const int64_t j0 = blk * kRowBlock, j1 = std::min(S, j0 + kRowBlock);
    float* qp = thread_scratch<0>(static_cast<size_t>(2 * d * S));  // rows j0..S-1 of one head
    float* gp = qp + S * d;
    for (int64_t j = j0; j < j1; ++j) {
      float* dk = dx + L.k(b, j, g);
      float* dv = dx + L.v(b, j, g);
      for (int64_t c = 0; c < d; ++c) dk[c] = dv[c] = 0.0f;
    }
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const int64_t bh = b * nq + h;
      pack_rows(qp, x + L.q(b, 0, h), L.width, j0, S, d);
      pack_rows(gp, go + b * S * ostride + h * d, ostride, j0, S, d);
      for (int64_t j = j0; j < j1; ++j) {
        const float* k = x + L.k(b, j, g);
        const float* v = x + L.v(b, j, g);
        float* dk = dx + L.k(b, j, g);
        float* dv = dx + L.v(b, j, g);
        const int64_t hi = docs.hi(b, j);
        for (int64_t i0 = j; i0 < hi; i0 += 4) {
          const int64_t m = std::min<int64_t>(4, hi - i0);
          float p[4], ds[4];
          for (int64_t u = 0; u < m; ++u) {
            const int64_t i = i0 + u;
            p[u] = std::exp(dot(qp + (i - j0) * d, k, d) * scale - l[bh * S + i]);
            ds[u] = p[u] * (dot(gp + (i - j0) * d, v, d) - D[bh * S + i]);
          }
          axpy_rows(dv, p, gp + (i0 - j0) * d, m, d);
          axpy_rows(dk, ds, qp + (i0 - j0) * d, m, d);
        }
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      scale_round(dx + L.k(b, j, g), scale, d, round);
      scale_round(dx + L.v(b, j, g), 1.0f, d, round);
    }
  }
};

}  // namespace

DocumentSpans document_spans(const AttentionShape& s) {
  const DocumentBoundaries& d = s.docs;
  const int64_t S = s.seq, T = s.batch * s.seq;
  if (d.count == 0) return {nullptr, nullptr, S};
  // (The offsets were checked against the contract by the op's checks: backend/op_checks.cpp.)
  thread_local std::vector<int32_t> spans;  // grow-only: steady-state calls do not allocate
  if (spans.size() < static_cast<size_t>(2 * T)) spans.resize(static_cast<size_t>(2 * T));
  int32_t* start = spans.data();
  int32_t* end = start + T;
  for (int64_t k = 0; k < d.count; ++k) {
    const int64_t a = d.host[k], e = d.host[k + 1];
    for (int64_t t = a; t < e; ++t) {
      start[t] = static_cast<int32_t>(a % S);
      end[t] = static_cast<int32_t>((e - 1) % S + 1);
    }
  }
  return {start, end, S};
}

void attention_forward(const OpContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& s) {
  const DocumentSpans docs = document_spans(s);
  if (attention_bf16_path(ctx)) return attention_forward_bf16(out, lse, qkv, s, docs);
  const int64_t d = s.head_dim, nq = s.q_heads, nkv = s.kv_heads;

  const QkvLayout L{s.seq, nq, nkv, d, (nq + 2 * nkv) * d};
  const int64_t S = s.seq, group = nq / nkv, BH = s.batch * nq;
  const int64_t blocks = (S + kRowBlock - 1) / kRowBlock;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float* x = qkv.f32();
  float* o = out.f32();
  float* l = lse.f32();
  const bool round = ctx.round_bf16;

  // Work item: (batch, query head, block of query rows [i0, i1)); it needs keys/values [0, i1).
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t bh = 0; bh < BH; ++bh) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t b = bh / nq, h = bh % nq, g = h / group;
      const int64_t i0 = blk * kRowBlock, i1 = std::min(S, i0 + kRowBlock);
      float* kp = thread_scratch<0>(static_cast<size_t>((2 * d + 1) * S));
      float* vp = kp + S * d;
      float* p = vp + S * d;
      pack_rows(kp, x + L.k(b, 0, g), L.width, 0, i1, d);
      pack_rows(vp, x + L.v(b, 0, g), L.width, 0, i1, d);
      for (int64_t i = i0; i < i1; ++i) {
        const float* q = x + L.q(b, i, h);
        const int64_t lo = docs.lo(b, i);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = lo; j <= i; ++j) {
          p[j] = dot(q, kp + j * d, d) * scale;
          m = std::max(m, p[j]);
        }
        float sum = 0.0f;
        for (int64_t j = lo; j <= i; ++j) {
          p[j] = std::exp(p[j] - m);
          sum += p[j];
        }
        float* orow = o + (b * S + i) * nq * d + h * d;
        for (int64_t c = 0; c < d; ++c) orow[c] = 0.0f;
        for (int64_t j = lo; j <= i; j += 4)
          axpy_rows(orow, p + j, vp + j * d, std::min<int64_t>(4, i + 1 - j), d);
        scale_round(orow, 1.0f / sum, d, round);
        l[bh * S + i] = m + std::log(sum);
      }
    }
  }
}

void attention_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& qkv, const AttentionShape& s) {
  const int64_t d = s.head_dim, nq = s.q_heads, nkv = s.kv_heads;
  const int64_t S = s.seq, BH = s.batch * nq, BG = s.batch * nkv, blocks = (S + kRowBlock - 1) / kRowBlock;
  const int64_t ostride = nq * d;
  const float* go = dout.f32();
  const float* o = out.f32();
  const DocumentSpans docs = document_spans(s);

  // D[b, h, i] = dO_i · O_i, in the calling thread's scratch, read by all threads below.
  float* D = thread_scratch<1>(static_cast<size_t>(BH * S));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t i = 0; i < S; ++i) {
      const int64_t off = ((bh / nq) * S + i) * ostride + (bh % nq) * d;
      D[bh * S + i] = dot(go + off, o + off, d);
    }
  if (attention_bf16_path(ctx)) return attention_backward_bf16(dqkv, dout, lse, qkv, s, docs, D);

  const AttentionBackward pass{QkvLayout{S, nq, nkv, d, (nq + 2 * nkv) * d},
                               S, nq, nkv, d, nq / nkv, ostride, 1.0f / std::sqrt(static_cast<float>(d)),
                               qkv.f32(), go, lse.f32(), D, dqkv.f32(), ctx.round_bf16, docs};
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t blk = 0; blk < blocks; ++blk) pass.dq_block(bh, blk);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t bg = 0; bg < BG; ++bg)
    for (int64_t blk = 0; blk < blocks; ++blk) pass.dkdv_block(bg, blk);
}

}  // namespace pl::cpu
