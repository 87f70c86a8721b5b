// CUDA elementwise ops (see backend/ops.h; CPU twin backend/cpu/elementwise.cpp).
// add: out = bf16(a + b), one element per thread (grid-stride); out may alias a or b since each
// element is read before it is written by the same thread. The fp32 add and the shared rounding
// make it bit-identical to the CPU. fill_zero: cudaMemsetAsync on the default stream (all-zero bytes
// are 0 in every dtype).
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"

namespace pl::cuda {

namespace {

constexpr int kThreads = 256;

// out, a, b: [n] bf16
__global__ void add_kernel(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_bf16(out, i, load_bf16(a, i) + load_bf16(b, i));
}

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

}  // namespace

void add(const OpContext&, const Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr const char* op = "add";
  check_arg(op, "out", out, DType::BF16);
  check_arg(op, "a", a, DType::BF16);
  check_arg(op, "b", b, DType::BF16);
  require(same_shape(a, b), op, "a " + describe(a) + " does not match b " + describe(b));
  require(same_shape(out, a), op, "out " + describe(out) + " does not match a " + describe(a));
  const int64_t n = out.numel();
  if (n == 0) return;
  add_kernel<<<grid_capped(n, kThreads), kThreads>>>(bf16_out(out), bf16_in(a), bf16_in(b), n);
  check_launch(op, "out " + out.shape_str());
}

void fill_zero(const OpContext&, const Tensor& x) {
  constexpr const char* op = "fill_zero";
  require(x.device == Device::CUDA, op, "x " + describe(x) + " must be a cuda tensor");
  require(x.data != nullptr || x.numel() == 0, op, "x " + describe(x) + " has no storage");
  if (x.numel() == 0) return;
  check(cudaMemsetAsync(x.data, 0, x.bytes(), 0), op, "x " + x.shape_str());
}

}  // namespace pl::cuda
