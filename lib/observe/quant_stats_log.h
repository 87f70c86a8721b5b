#pragma once
// --log-quant-stats-interval N: every N iterations the last micro-batch's backward records telemetry of every
// quantized operand it makes (amax, saturated values, underflowing blocks, relative error), printed after
// that iteration's log line from the last rank, one "quant stats |" line per operand.
#include <cstdint>

#include "observe/megatron_text_log.h"

namespace pl::observe {

class QuantStatsLog : public TrainObserver {
 public:
  QuantStatsLog(LineFn out, int64_t interval);
  void on_start(const RunStart& s, TrainerAccess&) override;
  void before_iteration(int64_t iteration, IterationRequests& requests) override;
  void on_interval(const log::IntervalRecord& r) override;

 private:
  bool due(int64_t iteration) const { return iteration % interval_ == 0; }
  LineFn out_;
  int64_t interval_;
  const LlamaModel* model_ = nullptr;
  bool last_rank_ = true;
};

}  // namespace pl::observe
