#pragma once
// The per-op roofline of the training step (--roofline): every op row the timers measured over a window
// of iterations (core/timers.h OpRow, costed by backend/op_costs.cpp), judged against this machine's
// measured ceilings (roofline/machine_ceilings.h) — the hierarchical roofline of Yang et al. (2020: one
// compute roof per precision, one bandwidth roof per memory level, each op placed by its arithmetic
// intensity and judged by the level its working set fits in) read as the time-based roofline of Wang et
// al. (2020: what each op costs in time, and what it would cost at its ceiling).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "config/model_config.h"
#include "core/timers.h"
#include "roofline/machine_ceilings.h"

namespace pl::roofline {

// The model's own GEMM shapes for a micro-batch of `tokens` tokens: fprop, dgrad and wgrad of the qkv,
// proj, fc1 and fc2 linears and of the LM head (padded vocabulary), deduplicated, largest first.
std::vector<GemmShape> model_gemm_shapes(const ModelConfig& m, int64_t tokens);

// What the trainer measured over its window of iterations.
struct Measurement {
  std::span<const OpRow> rows;  // summed over the window
  int64_t iterations = 0;       // in the window
  int64_t first_iteration = 0, last_iteration = 0;  // 1-based
  double step_ms_sum = 0.0;     // the step timer's time over the window's iterations
};

struct ReportRow {
  std::string op, kind, format, timer, memory_level;
  std::optional<std::string> linear, pass;
  double calls_per_iter = 0.0, ms_per_iter = 0.0, share = 0.0;  // share of the step
  double gflop_per_iter = 0.0, gb_per_iter = 0.0, intensity = 0.0;  // intensity: FLOP per byte
  double achieved_tflops = 0.0, achieved_gbps = 0.0;
  double compute_tflops = 0.0;   // the compute roof of its format
  double bandwidth_gbps = 0.0;   // the roof of its memory level
  double ceiling_tflops = 0.0;   // min(compute roof, intensity × bandwidth): attainable at its intensity
  double ms_at_ceiling = 0.0;    // max(FLOPs / compute roof, bytes / bandwidth)
  double pct_of_ceiling = 0.0;   // ms_at_ceiling / ms_per_iter
};

struct Report {
  std::string label, recipe;
  Measurement window;  // rows not kept (see rows below)
  MachineCeilings machine;
  std::vector<ReportRow> rows;  // by time, largest first
  double step_ms = 0.0, inside_ops_ms = 0.0, outside_ops_ms = 0.0, sol_ms = 0.0, pct_of_sol = 0.0;
  double op_gflop = 0.0, gemm_gflop = 0.0, attention_gflop = 0.0;  // per iteration, this table's counts
  double model_gflop = 0.0;  // Megatron's model FLOPs per iteration (the iteration line's TFLOP/s), per rank
  double mfu = 0.0;          // model FLOPs / step time / the GPU's BF16 dense datasheet peak; 0 on the CPU
  bool partial_window = false;
};

struct ReportContext {
  std::string label;          // e.g. "nvfp4" or "bf16"
  std::string recipe;         // the precision recipe's name
  double model_flops_per_iter_per_rank = 0.0;
};

Report build_report(const Measurement& m, const MachineCeilings& c, const ReportContext& ctx);
// The table and its summary, one string per line, each starting "roofline |" (grep-able).
std::vector<std::string> report_lines(const Report& r);
// The JSON of docs/PERFORMANCE.md's schema (scripts/roofline_plot.py reads it).
nlohmann::json report_json(const Report& r);
std::string report_json_text(const Report& r);  // report_json, indented, with a final newline

}  // namespace pl::roofline
