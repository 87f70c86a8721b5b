// CPU elementwise ops: add (a bf16-activation output, rounded when ctx.round_bf16; out may alias a or
// b since each element is read before it is written), accumulate_bf16 (an FP32 delta added into bf16
// storage, rounded the same way) and fill_zero. OpenMP over elements.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "numerics/bf16.h"

namespace pl::cpu {

void add(const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  const float* ap = a.f32();
  const float* bp = b.f32();
  float* o = out.f32();
  const bool round = ctx.round_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = round ? num::round_bf16(ap[i] + bp[i]) : ap[i] + bp[i];
}

void accumulate_bf16(const OpContext& ctx, const Tensor& acc, const Tensor& delta) {
  const int64_t n = acc.numel();
  float* a = acc.f32();
  const float* d = delta.f32();
  const bool round = ctx.round_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = round ? num::round_bf16(a[i] + d[i]) : a[i] + d[i];
}

void fill_zero(const OpContext&, const Tensor& x) {
  if (x.numel() == 0) return;
  // Any dtype: all-zero bytes are 0 in f32, bf16 and i32.
  char* p = static_cast<char*>(x.data);
  const int64_t bytes = static_cast<int64_t>(x.bytes());
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t chunks = (bytes + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b0 = c * kChunk;
    std::memset(p + b0, 0, static_cast<size_t>(std::min(kChunk, bytes - b0)));
  }
}

}  // namespace pl::cpu
