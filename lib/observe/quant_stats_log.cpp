#include "observe/quant_stats_log.h"

#include <fmt/format.h>

#include "core/error.h"
#include "model/llama.h"

namespace pl::observe {

QuantStatsLog::QuantStatsLog(LineFn out, int64_t interval) : out_(std::move(out)), interval_(interval) {
  PL_CHECK(interval >= 1, "internal: quantization statistics every {} iterations", interval);
}

void QuantStatsLog::on_start(const RunStart& s, TrainerAccess&) {
  model_ = &s.model;
  last_rank_ = s.world.rank() == s.world.size() - 1;
}

void QuantStatsLog::before_iteration(int64_t iteration, IterationRequests& requests) {
  if (due(iteration)) requests.quant_stats = true;
}

void QuantStatsLog::on_interval(const log::IntervalRecord& r) {
  if (!due(r.iteration) || !last_rank_) return;
  for (const LinearStats& ls : model_->quant_stats())
    for (const OperandStats& o : ls.operands)
      out_(fmt::format("quant stats | iteration {:8d} | layer {:3d} {:<11} | {:<13} | {:<8} | amax {:.6E} | saturated "
                       "{:.6f} | underflow blocks {:.6f} | rel error {:.6f}",
                       r.iteration, ls.layer, ls.linear, o.operand, quant_format_name(o.format), o.stats.amax,
                       o.stats.saturated_fraction, o.stats.underflow_fraction, o.stats.relative_error));
}

}  // namespace pl::observe
