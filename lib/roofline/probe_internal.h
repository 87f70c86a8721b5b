#pragma once
// The probe's parts (roofline/machine_ceilings.cpp puts them together): the GEMM roofs (probe_gemm.cpp) and
// the memory roofs (probe_memory.cpp), each measured through the ops and timed by the op rows of a Timers
// of the probe's own, so a roof is measured with the very clock the roofline report's rows are.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/device_info.h"
#include "core/timers.h"
#include "roofline/machine_ceilings.h"

namespace pl::roofline::detail {

// What the op rows measured over one timed batch of op calls.
struct RowTimes {
  double total_ms = 0.0;  // every row: the whole ops
  double gemm_ms = 0.0;   // the rows of kind Gemm: an emulated quantized GEMM's multiply, without its expansion
};

// A Timers with op rows (core/timers.h), and ctx pointed at it: time(f) runs f(ctx) with the rows active
// and sums what they measured (CPU: steady_clock per op; CUDA: events per op, read with one synchronize).
class OpRowClock {
 public:
  explicit OpRowClock(const OpContext& ctx) : timers_(ctx.device, 0, /*op_rows=*/true), ctx_(ctx) {
    ctx_.timers = &timers_;
    ctx_.tag = OpTag{};
  }
  const OpContext& ctx() const { return ctx_; }
  template <class F>
  RowTimes time(F&& calls) {
    timers_.clear_op_rows();
    timers_.set_op_rows_active(true);
    calls(ctx_);
    timers_.set_op_rows_active(false);
    RowTimes t;
    for (const OpRow& r : timers_.op_rows()) {
      t.total_ms += r.ms;
      if (r.key.kind == OpKind::Gemm) t.gemm_ms += r.ms;
    }
    return t;
  }

 private:
  Timers timers_;
  OpContext ctx_;
};

// Repetitions of a call of `work` units that make one timing of about `target` units (1..cap).
inline int reps_for(double work, double target, int cap) {
  if (!(work > 0.0)) return 1;
  const double r = std::ceil(target / work);
  return r < 1.0 ? 1 : r > cap ? cap : static_cast<int>(r);
}

// The sweep: the device's squares and the model's shapes, without duplicates or empty shapes, the
// kProbeMaxShapes with the most FLOPs, largest first.
std::vector<GemmShape> sweep_shapes(Device device, const std::vector<GemmShape>& model_shapes);
std::vector<GemmCeiling> probe_gemm_roofs(const OpContext& ctx, const std::vector<GemmShape>& shapes,
                                          const ProbeLineFn& progress);

// One memory level to measure: the triad's three arrays total `array_bytes`.
struct LevelPlan {
  std::string level;
  double capacity_bytes = 0.0;  // what the level holds (0: the last, unbounded)
  double array_bytes = 0.0;
};
// CPU: L2 (half of L2 share × threads), L3 (half of L3, when larger than the L2s), DRAM (4× the largest
// cache, within [64 MiB, 256 MiB]); GPU: L2 (half of it), HBM (8× L2, at least 256 MiB). Ascending capacity.
std::vector<LevelPlan> memory_levels(Device device, const DeviceIdentity& id);
std::vector<MemoryCeiling> probe_memory_roofs(const OpContext& ctx, const std::vector<LevelPlan>& levels,
                                              const ProbeLineFn& progress);

}  // namespace pl::roofline::detail
