// CPU elementwise ops: add (a bf16-activation output, rounded when ctx.round_bf16; out may alias a or
// b since each element is read before it is written) and fill_zero. OpenMP over elements.
#include <algorithm>
#include <cstring>

#include "backend/cpu/check.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "numerics/bf16.h"

namespace pl::cpu {

namespace {

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

}  // namespace

void add(const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr const char* op = "add";
  check_cpu(op, "out", out);
  check_cpu(op, "a", a);
  check_cpu(op, "b", b);
  PL_CHECK(same_shape(a, b), "{}: a {} does not match b {}", op, a.shape_str(), b.shape_str());
  PL_CHECK(same_shape(out, a), "{}: out {} does not match a {}", op, out.shape_str(), a.shape_str());
  const int64_t n = out.numel();
  const float* ap = a.f32();
  const float* bp = b.f32();
  float* o = out.f32();
  if (ctx.round_bf16) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = num::round_bf16(ap[i] + bp[i]);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = ap[i] + bp[i];
  }
}

void fill_zero(const OpContext& ctx, const Tensor& x) {
  (void)ctx;
  PL_CHECK(x.device == Device::CPU, "fill_zero: x {} ({}) must be a cpu tensor", x.shape_str(),
           device_name(x.device));
  PL_CHECK(x.data != nullptr || x.numel() == 0, "fill_zero: x {} has no storage", x.shape_str());
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
