// CPU fused softmax cross-entropy, OpenMP over tokens, one vectorized function per row (three passes over
// the row, which stays in L2 between them). Per row: max m; exps num::exp_f32(x - m) (numerics/exp.h: the
// same FP32 operations as the CUDA kernel's, so the exps agree bit for bit; until issue 25 the CPU called
// glibc's expf and CUDA its own, up to 2 ulp apart; exp_f32 is within 1 ulp of glibc's); their sum in fp32
// in the order of num::lane_sum with kCrossEntropyLanes lanes (numerics/reduce.h: the CUDA backend's
// schedule, so the sums agree too); loss = log(sum) - (x[target] - m), the log being the one remaining
// difference between the backends (glibc's logf, CUDA's logf within 1 ulp), once per row.
// Then, unless grad_scale == 0, the row is overwritten with grad_scale * (softmax - onehot(target)),
// rounded to bf16 when ctx.round_bf16 (dlogits is a bf16 activation).
// A target of -1 (a masked position, --eod-mask-loss) is ignored: loss 0, and a row of zeros as its gradient.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vector_clones.h"
#include "numerics/bf16.h"
#include "numerics/exp.h"
#include "numerics/reduce.h"

namespace pl::cpu {
namespace {
constexpr int kLanes = num::kCrossEntropyLanes;

// Max of a row in 16 independent lanes (a max is exact in any order; the lanes let it vectorize).
// A NaN never replaces the running max (the CUDA kernel's MaxOp).
PL_VECTOR_CLONES float row_max(const float* __restrict x, int64_t n) {
  float lane[16];
  for (float& l : lane) l = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; ++k) lane[k] = x[j + k] > lane[k] ? x[j + k] : lane[k];
  for (int k = 0; j < n; ++j, ++k) lane[k] = x[j] > lane[k] ? x[j] : lane[k];
  float m = lane[0];
  for (int k = 1; k < 16; ++k) m = lane[k] > m ? lane[k] : m;
  return m;
}

// Σ exp(x[j] - m) with the additions of num::lane_sum<kLanes> (term j into lane j % kLanes, lanes in
// increasing j, then num::tree_sum); when Store, every exp replaces its logit.
template <bool Store>
PL_VECTOR_CLONES float exp_sum(float* __restrict row, int64_t n, float m) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float e = num::exp_f32(row[i + k] - m);
      if constexpr (Store) row[i + k] = e;
      lane[k] = lane[k] + e;
    }
  for (int k = 0; i < n; ++i, ++k) {
    const float e = num::exp_f32(row[i] - m);
    if constexpr (Store) row[i] = e;
    lane[k] = lane[k] + e;
  }
  return num::tree_sum(lane, kLanes);
}

// row[j] = grad_scale * (row[j] * inv), rounded to bf16 when Round; the caller fixes the target's element.
template <bool Round>
PL_VECTOR_CLONES void scale_row(float* __restrict row, int64_t n, float inv, float grad_scale) {
  for (int64_t j = 0; j < n; ++j) {
    const float g = grad_scale * (row[j] * inv);
    row[j] = Round ? num::round_bf16(g) : g;
  }
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
    const int64_t y = tgt[t];
    if (y < 0) {  // -1: ignored (op_checks: the only negative target that reaches here)
      loss[t] = 0.0f;
      if (write_grad) std::fill(row, row + V, 0.0f);
      continue;
    }
    const float m = row_max(row, V);
    const float zy = row[y] - m;  // exact; read before the row is overwritten
    const float sum = write_grad ? exp_sum<true>(row, V, m) : exp_sum<false>(row, V, m);
    loss[t] = std::log(sum) - zy;
    if (!write_grad) continue;
    const float inv = 1.0f / sum;
    const float p_target = row[y] * inv;  // the target's softmax, before scale_row overwrites its exp
    if (round) {
      scale_row<true>(row, V, inv, grad_scale);
    } else {
      scale_row<false>(row, V, inv, grad_scale);
    }
    const float g_target = grad_scale * (p_target - 1.0f);
    row[y] = round ? num::round_bf16(g_target) : g_target;
  }
}

}  // namespace pl::cpu
