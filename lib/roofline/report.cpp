#include "roofline/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace pl::roofline {

namespace {

// A JSON null for an absent optional string.
nlohmann::json string_or_null(const std::optional<std::string>& s) { return s ? nlohmann::json(*s) : nlohmann::json(); }

// The compute roof a row is judged by: a GEMM by its format's measured roof; every other op by the BF16
// GEMM roof, the highest rate the program reaches on dense math here (attention runs BF16 tensor-core
// matmuls on a GPU; elementwise ops are judged by bandwidth in practice).
double compute_roof_tflops(const MachineCeilings& c, const OpRow& row) {
  const GemmCeiling* g = row.key.kind == OpKind::Gemm ? c.gemm_for(row.key.format) : nullptr;
  if (g == nullptr) g = c.gemm_for("bf16");
  return g != nullptr ? g->tflops : 0.0;
}

ReportRow judge_row(const OpRow& row, const MachineCeilings& c, double iterations, double step_ms) {
  ReportRow r;
  r.op = row.key.op;
  r.kind = op_kind_name(row.key.kind);
  r.format = row.key.format;
  r.timer = timer_name(row.category);
  if (const char* l = linear_kind_name(row.key.tag.linear)) r.linear = l;
  if (const char* p = gemm_pass_name(row.key.tag.pass)) r.pass = p;
  r.calls_per_iter = static_cast<double>(row.calls) / iterations;
  r.ms_per_iter = row.ms / iterations;
  r.share = step_ms > 0.0 ? r.ms_per_iter / step_ms : 0.0;
  const double flops = row.flops / iterations, bytes = row.bytes / iterations;
  r.gflop_per_iter = flops / 1e9;
  r.gb_per_iter = bytes / 1e9;
  r.intensity = bytes > 0.0 ? flops / bytes : 0.0;
  const double seconds = r.ms_per_iter / 1e3;
  r.achieved_tflops = seconds > 0.0 ? flops / seconds / 1e12 : 0.0;
  r.achieved_gbps = seconds > 0.0 ? bytes / seconds / 1e9 : 0.0;
  if (row.key.kind == OpKind::Comm) {
    // No interconnect roof is probed: a collective counts at its measured time (100% of "its ceiling").
    r.memory_level = "net";
    r.ms_at_ceiling = r.ms_per_iter;
    r.pct_of_ceiling = r.ms_per_iter > 0.0 ? 100.0 : 0.0;
    return r;
  }
  const MemoryCeiling& level = c.level_for(row.working_set);
  r.memory_level = level.level;
  r.bandwidth_gbps = level.gbps;
  r.compute_tflops = compute_roof_tflops(c, row);
  // Attainable rate at this intensity (the roofline), and the op's time if it ran there: the slower of
  // its arithmetic at the compute roof and its traffic at the bandwidth roof.
  r.ceiling_tflops = flops > 0.0 ? std::min(r.compute_tflops, r.intensity * r.bandwidth_gbps / 1e3) : 0.0;
  const double compute_s = r.compute_tflops > 0.0 ? flops / (r.compute_tflops * 1e12) : 0.0;
  const double memory_s = r.bandwidth_gbps > 0.0 ? bytes / (r.bandwidth_gbps * 1e9) : 0.0;
  r.ms_at_ceiling = std::max(compute_s, memory_s) * 1e3;
  r.pct_of_ceiling = r.ms_per_iter > 0.0 ? 100.0 * r.ms_at_ceiling / r.ms_per_iter : 0.0;
  return r;
}

std::string or_dash(const std::optional<std::string>& s) { return s ? *s : "-"; }

std::string table_row(const ReportRow& r) {
  return fmt::format("roofline | {:<22} {:<13} {:<7} {:<5} {:<6} {:>6.0f} {:>10.3f} {:>6.1f}% {:>9.3f} {:>8.4f} {:>8.2f} "
                     "{:>9.3f} {:>8.1f} {:<5} {:>9.3f} {:>6.1f}% {:>10.3f}",
                     r.op, r.kind, or_dash(r.linear), or_dash(r.pass), r.format, r.calls_per_iter, r.ms_per_iter,
                     100.0 * r.share, r.gflop_per_iter, r.gb_per_iter, r.intensity, r.achieved_tflops, r.achieved_gbps,
                     r.memory_level, r.ceiling_tflops, r.pct_of_ceiling, r.ms_at_ceiling);
}

}  // namespace

std::vector<GemmShape> model_gemm_shapes(const ModelConfig& m, int64_t tokens) {
  const int64_t h = m.hidden_size, q = m.num_attention_heads * m.kv_channels, kv = m.num_query_groups * m.kv_channels;
  const int64_t linears[5][2] = {  // {in, out}
      {h, q + 2 * kv}, {q, h}, {h, 2 * m.ffn_hidden_size}, {m.ffn_hidden_size, h}, {h, m.padded_vocab_size()}};
  std::vector<GemmShape> shapes;
  for (const auto& [in, out] : linears)
    for (const GemmShape s : {GemmShape{tokens, out, in}, GemmShape{tokens, in, out}, GemmShape{out, in, tokens}})
      if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
  std::sort(shapes.begin(), shapes.end(), [](const GemmShape& a, const GemmShape& b) {
    return static_cast<double>(a.m) * a.n * a.k > static_cast<double>(b.m) * b.n * b.k;
  });
  return shapes;
}

Report build_report(const Measurement& m, const MachineCeilings& c, const ReportContext& ctx) {
  PL_CHECK(m.iterations > 0, "internal: a roofline report needs at least one measured iteration");
  Report r;
  r.label = ctx.label;
  r.recipe = ctx.recipe;
  r.window = m;
  r.window.rows = {};
  r.machine = c;
  const auto iters = static_cast<double>(m.iterations);
  r.step_ms = m.step_ms_sum / iters;
  for (const OpRow& row : m.rows) {
    if (row.calls == 0) continue;
    ReportRow rr = judge_row(row, c, iters, r.step_ms);
    r.inside_ops_ms += rr.ms_per_iter;
    r.sol_ms += rr.ms_at_ceiling;
    r.op_gflop += rr.gflop_per_iter;
    if (row.key.kind == OpKind::Gemm) r.gemm_gflop += rr.gflop_per_iter;
    if (row.key.kind == OpKind::Attention) r.attention_gflop += rr.gflop_per_iter;
    r.rows.push_back(std::move(rr));
  }
  std::stable_sort(r.rows.begin(), r.rows.end(), [](const ReportRow& a, const ReportRow& b) { return a.ms_per_iter > b.ms_per_iter; });
  r.outside_ops_ms = r.step_ms - r.inside_ops_ms;
  r.pct_of_sol = r.step_ms > 0.0 ? 100.0 * r.sol_ms / r.step_ms : 0.0;
  r.model_gflop = ctx.model_flops_per_iter_per_rank / 1e9;
  const double peak = c.device == "cuda" ? datasheet_dense_tflops(c.name, "bf16") : 0.0;
  r.mfu = peak > 0.0 && r.step_ms > 0.0 ? ctx.model_flops_per_iter_per_rank / (r.step_ms / 1e3) / (peak * 1e12) : 0.0;
  return r;
}

std::vector<std::string> report_lines(const Report& r) {
  std::vector<std::string> out;
  out.push_back(fmt::format("roofline | {} ({}) | iterations {}-{} ({} measured) | per iteration; each op against the "
                            "ceiling at its arithmetic intensity (min of its format's GEMM roof and its memory "
                            "level's bandwidth × intensity)",
                            r.label, r.recipe, r.window.first_iteration, r.window.last_iteration, r.window.iterations));
  out.push_back(fmt::format("roofline | {:<22} {:<13} {:<7} {:<5} {:<6} {:>6} {:>10} {:>7} {:>9} {:>8} {:>8} {:>9} {:>8} "
                            "{:<5} {:>9} {:>7} {:>10}",
                            "op", "kind", "linear", "pass", "format", "calls", "ms/iter", "share", "GFLOP", "GB",
                            "FLOP/B", "TFLOP/s", "GB/s", "level", "ceil TF/s", "% ceil", "ms at ceil"));
  for (const ReportRow& row : r.rows) out.push_back(table_row(row));
  out.push_back(fmt::format("roofline | step {:.3f} ms = inside ops {:.3f} ms ({:.1f}%) + outside ops {:.3f} ms (host work, "
                            "gaps, waits)",
                            r.step_ms, r.inside_ops_ms, r.step_ms > 0 ? 100.0 * r.inside_ops_ms / r.step_ms : 0.0,
                            r.outside_ops_ms));
  out.push_back(fmt::format("roofline | speed of light {:.3f} ms (every op at its ceiling): step at {:.1f}% of speed of light",
                            r.sol_ms, r.pct_of_sol));
  out.push_back(fmt::format("roofline | FLOPs per iteration: this table {:.3f} GFLOP (GEMMs {:.3f}, attention {:.3f}, other "
                            "{:.3f}); Megatron's model FLOPs {:.3f} GFLOP (GEMMs without recomputation + causal attention as "
                            "s²/2 × 3 passes; this table counts what runs: attention as s(s+1)/2 with a 2.5× backward, "
                            "recomputed forwards, and every non-GEMM op)",
                            r.op_gflop, r.gemm_gflop, r.attention_gflop, r.op_gflop - r.gemm_gflop - r.attention_gflop,
                            r.model_gflop));
  if (r.mfu > 0.0)
    out.push_back(fmt::format("roofline | MFU {:.1f}% (model FLOPs against the BF16 dense datasheet peak of {})", 100.0 * r.mfu,
                              r.machine.name));
  if (std::any_of(r.rows.begin(), r.rows.end(), [](const ReportRow& x) { return x.kind == "comm"; }))
    out.push_back("roofline | communication rows: the time the step waits for the collective, counted at that time in "
                  "the speed of light (no interconnect roof is probed); GB = NCCL-tests' bus bytes");
  out.push_back("roofline | timing every op adds a little overhead (one timer pair per op; CUDA events on a GPU)");
  return out;
}

nlohmann::json report_json(const Report& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ReportRow& x : r.rows)
    rows.push_back({{"op", x.op}, {"kind", x.kind}, {"linear", string_or_null(x.linear)}, {"pass", string_or_null(x.pass)},
                    {"format", x.format}, {"timer", x.timer}, {"calls_per_iter", x.calls_per_iter},
                    {"ms_per_iter", x.ms_per_iter}, {"share", x.share}, {"gflop_per_iter", x.gflop_per_iter},
                    {"gb_per_iter", x.gb_per_iter}, {"intensity", x.intensity}, {"memory_level", x.memory_level},
                    {"compute_tflops", x.compute_tflops}, {"bandwidth_gbps", x.bandwidth_gbps},
                    {"ceiling_tflops", x.ceiling_tflops}, {"achieved_tflops", x.achieved_tflops},
                    {"achieved_gbps", x.achieved_gbps}, {"pct_of_ceiling", x.pct_of_ceiling},
                    {"ms_at_ceiling", x.ms_at_ceiling}});
  const nlohmann::json machine = to_json(r.machine);
  nlohmann::json j = {{"label", r.label}, {"recipe", r.recipe}, {"iterations", r.window.iterations},
                      {"first_iteration", r.window.first_iteration}, {"last_iteration", r.window.last_iteration},
                      {"step_ms", r.step_ms}, {"sol_ms", r.sol_ms}, {"pct_of_sol", r.pct_of_sol},
                      {"inside_ops_ms", r.inside_ops_ms}, {"outside_ops_ms", r.outside_ops_ms},
                      {"op_gflop_per_iter", r.op_gflop}, {"gemm_gflop_per_iter", r.gemm_gflop},
                      {"attention_gflop_per_iter", r.attention_gflop}, {"model_gflop_per_iter", r.model_gflop},
                      {"rows", std::move(rows)}};
  j["machine"] = machine["machine"];
  j["ceilings"] = {{"gemm", machine["gemm"]}, {"memory", machine["memory"]}};
  if (r.mfu > 0.0) j["mfu"] = r.mfu;
  return j;
}

std::string report_json_text(const Report& r) { return report_json(r).dump(1) + "\n"; }

}  // namespace pl::roofline
