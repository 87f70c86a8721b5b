// CPU fused softmax cross-entropy, OpenMP over tokens. Per row: max m, exps in fp32, their sum in fp32
// by num::lane_sum with kCrossEntropyLanes lanes (numerics/reduce.h: the CUDA backend's schedule, so
// the sums differ only by the exps, CUDA's expf not being correctly rounded), loss = log(sum) - (x[target] - m).
// Then, unless grad_scale == 0, the row is overwritten with grad_scale * (softmax - onehot(target)),
// rounded to bf16 when ctx.round_bf16 (dlogits is a bf16 activation).
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "numerics/bf16.h"
#include "numerics/reduce.h"

namespace pl::cpu {
namespace {
// Max of a row in eight independent lanes (a max is exact in any order; the lanes let it vectorize).
float row_max(const float* x, int64_t n) {
  float lane[8];
  for (float& l : lane) l = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] = x[j + k] > lane[k] ? x[j + k] : lane[k];
  for (int k = 0; j < n; ++j, ++k) lane[k] = x[j] > lane[k] ? x[j] : lane[k];
  float m = lane[0];
  for (int k = 1; k < 8; ++k) m = lane[k] > m ? lane[k] : m;
  return m;
}

}  // namespace

void cross_entropy_forward_backward(const OpContext& ctx, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, float grad_scale) {
  const int64_t T = logits.dim(0), V = logits.dim(1);
  const int32_t* tgt = targets.i32();
  float* x = logits.f32();
  float* loss = losses.f32();
  const bool round = ctx.round_bf16;
  const bool write_grad = grad_scale != 0.0f;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* row = x + t * V;
    const float m = row_max(row, V);
    const int64_t y = tgt[t];
    const float zy = row[y] - m;  // exact; read before the row is overwritten
    // Exps in fp32; when the gradient is wanted they are stored in the row (one exp per logit).
    const auto exp_store = [row, m](int64_t j) {
      const float e = std::exp(row[j] - m);
      row[j] = e;
      return e;
    };
    const auto exp_only = [row, m](int64_t j) { return std::exp(row[j] - m); };
    const float sum = write_grad ? num::lane_sum<num::kCrossEntropyLanes>(V, exp_store)
                                 : num::lane_sum<num::kCrossEntropyLanes>(V, exp_only);
    loss[t] = std::log(sum) - zy;
    if (!write_grad) continue;
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < V; ++j) {
      const float p = row[j] * inv;
      const float g = grad_scale * (j == y ? p - 1.0f : p);
      row[j] = round ? num::round_bf16(g) : g;
    }
  }
}

}  // namespace pl::cpu
