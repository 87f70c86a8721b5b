// CPU elementwise ops: add, scale and dropout (bf16-activation outputs, rounded when ctx.round_bf16; out may
// alias an input since each element is read before it is written), accumulate_bf16 (an FP32 delta added into
// bf16 storage, rounded the same way) and fill_zero. OpenMP over elements.
#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "numerics/bf16.h"
#include "numerics/dropout.h"

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

void scale(const OpContext& ctx, const Tensor& out, const Tensor& x, float s) {
  const int64_t n = out.numel();
  const float* xp = x.f32();
  float* o = out.f32();
  const bool round = ctx.round_bf16;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = round ? num::round_bf16(s * xp[i]) : s * xp[i];
}

void dropout(const OpContext& ctx, const Tensor& out, const Tensor& x, float p, uint64_t seed, uint32_t stream_id,
             uint64_t counter) {
  const int64_t n = out.numel(), quads = (n + 3) / 4;
  const float* xp = x.f32();
  float* o = out.f32();
  const bool round = ctx.round_bf16;
  const uint32_t threshold = num::dropout_threshold(p);
  const float keep_scale = num::dropout_scale(p);
#pragma omp parallel for schedule(static)
  for (int64_t q = 0; q < quads; ++q) {
    uint32_t w[4];
    num::dropout_words(seed, stream_id, counter, static_cast<uint64_t>(q), w);
    for (int64_t k = 0, i = 4 * q; k < 4 && i < n; ++k, ++i) {
      const float v = num::dropout_value(xp[i], w[k] >= threshold, keep_scale);
      o[i] = round ? num::round_bf16(v) : v;
    }
  }
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
