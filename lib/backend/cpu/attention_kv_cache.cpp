// CPU attention against a KV cache (backend/op_list.h attention_kv_cache; the generate tool). The new rows' k and v
// heads go into the caches first; then, per (new row i, query head h), over the cached rows j <= past + i:
// s_j = q·k_j / sqrt(d) in fp32, softmax in fp32 (max-subtracted, exp_f32, an fp32 sum in key order), and
// out = Σ_j p_j v_j in fp32 in key order, rounded to bf16 (round_bf16) once. The same terms as
// attention_forward's FP32 path (cpu/attention.cpp) for one sequence, so with past = 0 it is causal attention.
// OpenMP over (row, head) items: each owns its output head, no atomics, any thread count gives the same bits.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "numerics/bf16.h"
#include "numerics/exp.h"

namespace pl::cpu {

void attention_kv_cache(const OpContext& ctx, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& qkv, int64_t past, int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  const int64_t n = qkv.dim(0), d = head_dim, W = qkv.dim(1), kv = kv_heads * d, group = q_heads / kv_heads;
  const float* x = qkv.f32();
  float* kc = k_cache.f32();
  float* vc = v_cache.f32();
  for (int64_t i = 0; i < n; ++i) {  // the new rows into the caches
    std::copy(x + i * W + q_heads * d, x + i * W + q_heads * d + kv, kc + (past + i) * kv);
    std::copy(x + i * W + q_heads * d + kv, x + i * W + q_heads * d + 2 * kv, vc + (past + i) * kv);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const bool round = ctx.round_bf16;
  float* o = out.f32();
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(past + n)), acc(static_cast<size_t>(d));
#pragma omp for schedule(dynamic)
    for (int64_t item = 0; item < n * q_heads; ++item) {
      const int64_t i = item / q_heads, h = item % q_heads, g = h / group, keys = past + i + 1;
      const float* q = x + i * W + h * d;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < keys; ++j) {
        const float* k = kc + j * kv + g * d;
        float s = 0.0f;
        for (int64_t e = 0; e < d; ++e) s += q[e] * k[e];
        p[static_cast<size_t>(j)] = s * scale;
        m = std::max(m, p[static_cast<size_t>(j)]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < keys; ++j) {
        p[static_cast<size_t>(j)] = num::exp_f32(p[static_cast<size_t>(j)] - m);
        sum += p[static_cast<size_t>(j)];
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < keys; ++j) {
        const float* v = vc + j * kv + g * d;
        const float w = p[static_cast<size_t>(j)];
        for (int64_t e = 0; e < d; ++e) acc[static_cast<size_t>(e)] += w * v[e];
      }
      float* y = o + i * q_heads * d + h * d;
      for (int64_t e = 0; e < d; ++e) {
        const float val = acc[static_cast<size_t>(e)] / sum;
        y[e] = round ? num::round_bf16(val) : val;
      }
    }
  }
}

}  // namespace pl::cpu
