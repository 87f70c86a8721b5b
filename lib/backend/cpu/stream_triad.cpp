// CPU stream_triad: a = b + s·c, the STREAM benchmark's triad (McCalpin), the machine probe's bandwidth
// kernel (roofline/machine_ceilings.cpp). OpenMP parallel for with a static schedule, as STREAM's own
// loop: every call gives each thread the same contiguous slice, so the thread that first touched a slice
// (the probe fills the arrays with this same schedule) keeps reading it from its own cache or, on a
// multi-socket machine, from its own NUMA node's DRAM.
#include "backend/cpu/cpu_ops.h"

namespace pl::cpu {

void stream_triad(const OpContext&, const Tensor& a, const Tensor& b, const Tensor& c, float s) {
  const int64_t n = a.numel();
  float* ap = a.f32();
  const float* bp = b.f32();
  const float* cp = c.f32();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) ap[i] = bp[i] + s * cp[i];
}

}  // namespace pl::cpu
