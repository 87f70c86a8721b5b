// CUDA fused softmax cross-entropy (see backend/ops.h; CPU twin backend/cpu/cross_entropy.cpp).
//
// grid: T blocks, one per row; block: kThreads threads striding over the V logits (bf16 in place;
// no fp32 copy of the row). Three passes over the row (it stays in L2 between them):
//   1. m = max (fp32; exact in any order), CUB BlockReduce;
//   2. Σ exp(x - m), each exp fp32, summed in double (as the CPU does), BlockReduce;
//      losses[t] = log(float(Σ)) - (x[target] - m), x[target] read before any write;
//   3. unless grad_scale == 0: x = bf16(grad_scale * (exp(x - m) * (1/Σ) - onehot)), the exponentials
//      recomputed (same inputs, same device expf, so the same values as in pass 2).
// The expressions are the CPU's; the differences are expf/logf (CUDA: 2 ulp / 1 ulp, glibc: nearly
// always correctly rounded) and the order of the double sum.
// A target outside [0, V) leaves its row untouched and is reported after the kernel (one sync).
#include <cub/cub.cuh>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"

namespace pl::cuda {

namespace {

constexpr int kThreads = 512;

// The CPU's max expression (a NaN never replaces the running max).
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return b > a ? b : a; }
};

// losses[T] f32, logits[T,V] bf16 (overwritten with dlogits unless grad_scale == 0), targets[T] i32
__global__ void cross_entropy_kernel(float* losses, uint16_t* logits, const int32_t* targets, int64_t V,
                                     float grad_scale, unsigned long long* bad) {
  __shared__ typename cub::BlockReduce<float, kThreads>::TempStorage max_temp;
  __shared__ typename cub::BlockReduce<double, kThreads>::TempStorage sum_temp;
  __shared__ float m_shared, sum_shared;
  const int64_t t = blockIdx.x;
  const int32_t y = targets[t];
  if (y < 0 || y >= V) {  // uniform over the block: every thread returns before any barrier
    if (threadIdx.x == 0) flag_bad_row(bad, t);
    return;
  }
  uint16_t* row = logits + t * V;

  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) m = MaxOp()(m, load_bf16(row, j));
  m = cub::BlockReduce<float, kThreads>(max_temp).Reduce(m, MaxOp());
  if (threadIdx.x == 0) m_shared = m;
  __syncthreads();
  m = m_shared;

  double s = 0.0;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) s += static_cast<double>(expf(load_bf16(row, j) - m));
  s = cub::BlockReduce<double, kThreads>(sum_temp).Sum(s);
  if (threadIdx.x == 0) {
    const float sum = static_cast<float>(s);
    const float zy = load_bf16(row, y) - m;
    losses[t] = logf(sum) - zy;
    sum_shared = sum;
  }
  __syncthreads();  // row[y] has been read; the row may be overwritten from here on
  if (grad_scale == 0.0f) return;
  const float inv = 1.0f / sum_shared;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float p = expf(load_bf16(row, j) - m) * inv;
    store_bf16(row, j, grad_scale * (j == y ? p - 1.0f : p));
  }
}

}  // namespace

void cross_entropy_forward_backward(const OpContext&, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, float grad_scale) {
  constexpr const char* op = "cross_entropy_forward_backward";
  check_arg(op, "losses", losses, DType::F32, 1);
  check_arg(op, "logits", logits, DType::BF16, 2);
  check_arg(op, "targets", targets, DType::I32, 1);
  require(targets.dim(0) == logits.dim(0) && logits.dim(1) > 0, op,
          "targets " + describe(targets) + " does not match logits " + describe(logits));
  require(losses.dim(0) == logits.dim(0), op, "losses " + describe(losses) + " does not match logits " +
                                                  describe(logits) + " (expected [" + std::to_string(logits.dim(0)) + "])");
  const int64_t T = logits.dim(0), V = logits.dim(1);
  require(T < (int64_t{1} << 31), op, "logits " + describe(logits) + " has more rows than a grid holds");
  if (T == 0) return;
  const std::string what = "logits " + dims(T, V);
  static BadRowFlag flag;
  unsigned long long* bad = flag.arm(op, what);
  cross_entropy_kernel<<<static_cast<unsigned>(T), kThreads>>>(f32_out(losses), bf16_out(logits), i32_in(targets), V,
                                                                grad_scale, bad);
  check_launch(op, what);
  flag.check_after(op, what, "targets", i32_in(targets), V);
}

}  // namespace pl::cuda
