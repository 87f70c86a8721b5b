// --roofline and --probe-machine: this machine's measured ceilings (roofline/machine_ceilings.h, cached),
// and the per-op report of the training step the trainer measures (roofline/report.h), printed as a table
// and written as JSON for scripts/roofline_plot.py.
#include <fmt/format.h>

#include "model/accounting.h"
#include "pretrain_llama.h"
#include "roofline/machine_ceilings.h"
#include "roofline/report.h"

namespace pl::pretrain {

namespace {

// --machine-ceilings: "" is the default cache file, "none" no cache.
std::string ceilings_cache(const Options& o) {
  if (o.machine_ceilings == "none") return "";
  return o.machine_ceilings.empty() ? roofline::default_ceilings_cache_path() : o.machine_ceilings;
}

roofline::MachineCeilings measure_ceilings(const Options& o, const RunSetup& s, const OpContext& ctx, const Logger& out) {
  const std::string cache = ceilings_cache(o);
  out->info("roofline | machine ceilings: {}", cache.empty() ? "measuring (not cached: --machine-ceilings none)"
                                                             : fmt::format("cache {}", cache));
  roofline::MachineCeilings c = roofline::load_or_probe(
      ctx, cache, roofline::model_gemm_shapes(s.mc, o.train.micro_batch_size * o.train.seq_length),
      [&](const std::string& line) { out->info("roofline | {}", line); });
  for (const std::string& line : roofline::ceilings_lines(c)) out->info("roofline | {}", line);
  return c;
}

// The label of a report: the format of the recipe's quantized linears, or bf16.
std::string report_label(const RunSetup& s) { return format_name(s.plan.quantized()); }

}  // namespace

int probe_machine_command(const Options& o, const RunSetup& s, const OpContext& ctx, const Logger& out) {
  (void)measure_ceilings(o, s, ctx, out);
  return 0;
}

std::shared_ptr<const roofline::MachineCeilings> roofline_ceilings(const Options& o, const RunSetup& s,
                                                                   const OpContext& ctx, const parallel::World& world,
                                                                   const Logger& out) {
  // Rank 0 alone probes the machine (one writer of the cache) and reports.
  if (!o.outputs.roofline.on || world.rank() != 0) return nullptr;
  auto c = std::make_shared<const roofline::MachineCeilings>(measure_ceilings(o, s, ctx, out));
  reset_peak_memory_stats(ctx.device);  // the probe's operands are freed: not the run's peak memory
  return c;
}

std::unique_ptr<observe::RooflineReport> roofline_report(const Options& o, const RunSetup& s,
                                                         std::shared_ptr<const roofline::MachineCeilings> ceilings,
                                                         const Logger& out) {
  if (!ceilings) return nullptr;  // rank 0 measures its op rows and reports them
  const TrainConfig& t = o.train;
  roofline::ReportContext rc{
      .label = report_label(s),
      .recipe = s.recipe.name,
      .model_flops_per_iter_per_rank = flops_per_iteration(s.mc, t.global_batch_size, t.seq_length) /
                                       static_cast<double>(t.data_parallel_size)};
  return std::make_unique<observe::RooflineReport>(o.outputs.roofline, o.outputs.profile, std::move(ceilings),
                                                   std::move(rc), [out](const std::string& line) { out->info("{}", line); });
}

}  // namespace pl::pretrain
