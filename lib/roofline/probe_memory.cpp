// The memory roofs of the machine probe: the bandwidth of each memory level, measured with the
// stream_triad op (the STREAM benchmark's triad, McCalpin: a = b + s·c, 3·n·4 bytes per call counted as
// STREAM counts them, two reads and one write; the write-allocate read of `a` that a write-back cache adds
// is not counted) on arrays sized for the level, the best of several timings, each timing enough calls
// to move about 64 MiB (CPU) or 2 GiB (GPU), after one warm-up batch that brings the arrays into the level.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "roofline/probe_internal.h"

namespace pl::roofline::detail {

namespace {

constexpr int kTrials = 5;
constexpr double kMiB = 1048576.0;

// Host memory for one triad array, first touched by the same static OpenMP schedule the CPU triad uses,
// so each thread's slice is in its own cache (and, on a NUMA machine, its own node's DRAM). Buffer would
// zero it on the calling thread.
struct HostArray {
  std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};
  explicit HostArray(int64_t n) {
    const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
    data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    PL_CHECK(data != nullptr, "the machine probe: out of host memory allocating {:.1f} MiB", bytes / kMiB);
    float* p = data.get();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = 1.0f;
  }
};

// The triad's three arrays of n floats on ctx's device, allocated once for the level.
struct TriadArrays {
  std::vector<HostArray> host;
  std::vector<Buffer> device;
  Tensor a, b, c;

  TriadArrays(Device dev, int64_t n) {
    Tensor* ts[] = {&a, &b, &c};
    for (Tensor* t : ts) {
      if (dev == Device::CPU) {
        host.emplace_back(n);
        *t = Tensor(host.back().data.get(), {n}, DType::F32, Device::CPU);
      } else {
        device.emplace_back(static_cast<size_t>(n) * sizeof(float), dev);  // zeroed by Buffer
        *t = device.back().as({n}, DType::F32);
      }
    }
  }
};

MemoryCeiling measure_level(OpRowClock& clock, const LevelPlan& plan) {
  const OpContext& ctx = clock.ctx();
  // n a multiple of 64 floats: every array a whole number of cache lines and of float4s.
  const int64_t n = std::max<int64_t>(64, static_cast<int64_t>(plan.array_bytes / 12.0) / 64 * 64);
  TriadArrays arrays(ctx.device, n);
  const double bytes = 3.0 * static_cast<double>(n) * sizeof(float);
  const int reps = reps_for(bytes, ctx.device == Device::CUDA ? 2048 * kMiB : 64 * kMiB, 4096);
  const auto batch = [&](const OpContext& c) {
    for (int r = 0; r < reps; ++r) stream_triad(c, arrays.a, arrays.b, arrays.c, 3.0f);
  };
  batch(ctx);  // warm-up: the arrays into the level, page faults taken
  double best_ms = std::numeric_limits<double>::infinity();
  for (int t = 0; t < kTrials; ++t) best_ms = std::min(best_ms, clock.time(batch).total_ms);
  MemoryCeiling m;
  m.level = plan.level;
  m.capacity_bytes = plan.capacity_bytes;
  m.gbps = best_ms > 0.0 && std::isfinite(best_ms) ? bytes * reps / (best_ms * 1e-3) / 1e9 : 0.0;
  return m;
}

}  // namespace

std::vector<LevelPlan> memory_levels(Device device, const DeviceIdentity& id) {
  std::vector<LevelPlan> levels;
  if (device == Device::CUDA) {
    if (id.l2_bytes > 0.0) levels.push_back({"L2", id.l2_bytes, id.l2_bytes / 2.0});
    levels.push_back({"HBM", 0.0, std::max(8.0 * id.l2_bytes, 256.0 * kMiB)});
    return levels;
  }
  const double l2_all = id.l2_bytes * std::max(1, id.threads);  // private L2s: each thread its own share
  if (l2_all > 0.0) levels.push_back({"L2", l2_all, l2_all / 2.0});
  if (id.l3_bytes > l2_all) levels.push_back({"L3", id.l3_bytes, id.l3_bytes / 2.0});
  const double largest_cache = std::max(l2_all, id.l3_bytes);
  levels.push_back({"DRAM", 0.0, std::clamp(4.0 * largest_cache, 64.0 * kMiB, 256.0 * kMiB)});
  return levels;
}

std::vector<MemoryCeiling> probe_memory_roofs(const OpContext& ctx, const std::vector<LevelPlan>& levels,
                                              const ProbeLineFn& progress) {
  OpRowClock clock(ctx);
  std::vector<MemoryCeiling> roofs;
  for (const LevelPlan& plan : levels) {
    roofs.push_back(measure_level(clock, plan));
    if (progress)
      progress(fmt::format("probe: memory {} {:.1f} GB/s (triad over {:.2f} MiB)", plan.level, roofs.back().gbps,
                           plan.array_bytes / kMiB));
  }
  return roofs;
}

}  // namespace pl::roofline::detail
