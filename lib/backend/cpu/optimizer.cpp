// CPU optimizer ops: the global-norm reduction, the AdamW step over a flat range and the master ->
// param copy. The per-element AdamW math is num::adamw_element, shared with the CUDA backend.
#include <algorithm>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vector_clones.h"
#include "numerics/adamw.h"
#include "numerics/bf16.h"
#include "numerics/reduce.h"

namespace pl::cpu {
// Σ x² in fp32 with the schedule of numerics/reduce.h, shared with the CUDA backend (bit-identical):
// fixed chunks of kSumSquaresChunk elements, each a num::lane_sum of x² with kTreeGroup lanes; the chunk
// partials combined by num::group_tree_sum. The result is a function of the data alone, not of the
// thread count. The chunk partials live in the calling thread's thread_scratch.
namespace {
// part[c] = the lane sum of x² over chunk c of x[n] (chunks(n) partials).
void chunk_partials(float* part, const float* p, int64_t n) {
  const int64_t chunks = (n + num::kSumSquaresChunk - 1) / num::kSumSquaresChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * num::kSumSquaresChunk, len = std::min(n - i0, num::kSumSquaresChunk);
    const float* q = p + i0;
    part[c] = num::lane_sum<num::kTreeGroup>(len, [q](int64_t i) { return q[i] * q[i]; });
  }
}
}  // namespace

double sum_of_squares(const OpContext&, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int64_t chunks = (n + num::kSumSquaresChunk - 1) / num::kSumSquaresChunk;
  float* partial = thread_scratch<3>(static_cast<size_t>(chunks));
  chunk_partials(partial, x.f32(), n);
  return static_cast<double>(num::group_tree_sum(partial, chunks));
}

void sum_of_squares_chunks(const OpContext&, const Tensor& partials, const Tensor& x) {
  chunk_partials(partials.f32(), x.f32(), x.numel());
}

// One pass over the flat buffers: the segments between and inside the no-decay ranges, in order, each
// with its hyper-parameters (weight decay 0 inside a range), in one OpenMP region. Per element the math
// is the same num::adamw_element_stored with num::adamw_hyper's hyper-parameters as the CUDA backend's;
// the moments are stored as their tensors' dtypes say (F32, or BF16 bits under the precision-aware
// optimizer: loaded to FP32, stored RNE).
namespace {
// A parameter element as its tensor stores it: FP32 (the CPU model's bf16 values in FP32 storage), or
// bf16 bits (the staging of the optimizer offload, whose bytes go to a GPU's BF16 weights).
inline void store_param(float& dst, float master, bool round) { dst = round ? num::round_bf16(master) : master; }
inline void store_param(uint16_t& dst, float master, bool) { dst = num::float_to_bf16_bits(master); }

// Elements [0, n) of the flat buffers (already offset), vectorized; the caller splits a segment into
// chunks across threads. Each element's result depends on that element alone, so the split changes nothing.
template <class P, class G, class M, class V>
PL_VECTOR_CLONES void adamw_range(P* __restrict pp, float* __restrict mp, const G* __restrict gp, M* __restrict m1,
                                  V* __restrict m2, int64_t n, const num::AdamWHyper h, bool round) {
  if (pp == nullptr) {  // FP8 primary weights: the model makes the BF16 weights it keeps (one test, hoisted)
    for (int64_t i = 0; i < n; ++i) num::adamw_element_stored(mp[i], m1[i], m2[i], num::state_load(gp[i]), h);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    num::adamw_element_stored(mp[i], m1[i], m2[i], num::state_load(gp[i]), h);
    store_param(pp[i], mp[i], round);
  }
}

constexpr int64_t kAdamWChunk = 4096;  // elements per call of adamw_range (L1-sized across the 5 streams)

template <class P, class G, class M, class V>
void adamw_multi(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                 const ElementRanges& no_decay, const num::AdamWHyper& decay, const num::AdamWHyper& plain,
                 bool round) {
  const int64_t n = master.numel();
  P* pp = param.numel() == 0 ? nullptr : param.ptr<P>();  // empty: no BF16 weights written
  float* mp = master.f32();
  const G* gp = grad.ptr<G>();
  M* m1 = m.ptr<M>();
  V* m2 = v.ptr<V>();
  const int64_t segments = 2 * no_decay.count + 1;  // decayed, range 0, decayed, range 1, ..., decayed
#pragma omp parallel
  for (int64_t sgm = 0; sgm < segments; ++sgm) {
    const int64_t r = sgm / 2;
    const bool in_range = sgm % 2 == 1;
    const int64_t i0 = in_range ? no_decay.host[2 * r] : (r > 0 ? no_decay.host[2 * r - 1] : 0);
    const int64_t i1 = in_range ? no_decay.host[2 * r + 1] : (r < no_decay.count ? no_decay.host[2 * r] : n);
    const num::AdamWHyper& h = in_range ? plain : decay;
    const int64_t chunks = (i1 - i0 + kAdamWChunk - 1) / kAdamWChunk;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t b = i0 + c * kAdamWChunk, len = std::min(kAdamWChunk, i1 - b);
      adamw_range<P, G, M, V>(pp ? pp + b : nullptr, mp + b, gp + b, m1 + b, m2 + b, len, h, round);
    }
  }
}
}  // namespace

void adamw_update_multi(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                        const Tensor& m, const Tensor& v, const ElementRanges& no_decay, const AdamWStep& step) {
  const auto hyper = [&step](float wd) {
    return num::adamw_hyper(step.lr, step.beta1, step.beta2, step.eps, wd, step.step, step.grad_scale);
  };
  const num::AdamWHyper decay = hyper(step.weight_decay), plain = hyper(0.0f);
  const bool round = ctx.round_bf16;
  // One instantiation per storage combination (param, grad, m, v each FP32 or bf16 bits).
  with_float_storage(param.dtype, [&]<class P>(P*) {
    with_float_storage(grad.dtype, [&]<class G>(G*) {
      with_float_storage(m.dtype, [&]<class M>(M*) {
        with_float_storage(v.dtype, [&]<class V>(V*) {
          adamw_multi<P, G, M, V>(param, master, grad, m, v, no_decay, decay, plain, round);
        });
      });
    });
  });
}

void copy_master_to_param(const OpContext& ctx, const Tensor& param, const Tensor& master) {
  const int64_t n = master.numel();
  const float* mp = master.f32();
  const bool round = ctx.round_bf16;
  with_float_storage(param.dtype, [&]<class P>(P*) {
    P* pp = param.ptr<P>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) store_param(pp[i], mp[i], round);
  });
}

}  // namespace pl::cpu
