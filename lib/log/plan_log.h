#pragma once
// The memory plan's lines (pretrain_llama --dry-run and the start-up fit check).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pl::log {

// bytes: weights, gradients, master weights, optimizer state, activations and scratch, quantized
// copies, library workspaces (MemoryPlan::categories()). One row per category, then Megatron's
// category (the first four) and the total, "<name> <GB (1e9)> GB  <MB (2^20)> MB"; gemm_note, when
// not empty, as the last line.
// optimizer_label: the optimizer row's name when the moments are not fp32 (empty: the default name).
// offload (--optimizer-cpu-offload): master and optimizer rows are marked as on the host, the host's
// pinned gradient copy and weight staging follow them, and the total is split into "total on the
// <device>" (without master and optimizer) and "total on the host".
struct OffloadRows {
  double host_grads = 0, host_staging = 0;
  const char* device = "GPU";
};
// grads_label: the gradients row's name when they are not fp32 (--main-grads-dtype bf16); weights_label: the
// weights row's name when not every weight is kept in bf16 (FP8 primary weights).
std::vector<std::string> memory_plan_lines(std::span<const double, 7> bytes, const std::string& gemm_note,
                                           const std::string& optimizer_label = "",
                                           const OffloadRows* offload = nullptr, const std::string& grads_label = "",
                                           const std::string& weights_label = "");
// The one line of a plan that does not fit: the biggest categories and the flags that shrink them.
// slack: op scratch and free margin beyond the plan; recompute_off: --recompute none. bytes as on the
// device (with offload: master and optimizer 0).
std::string memory_does_not_fit_line(const std::string& model, int64_t micro_batch, int64_t seq_length,
                                     const char* device, std::span<const double, 7> bytes, double slack,
                                     double available, bool recompute_off);

// One GPU of the --dry-run fit table (model/fit_plan.h computes it; GB = 1e9 bytes as the plan's rows).
struct FitRow {
  std::string gpu;       // "H100 80GB"
  int sm = 0;
  double usable = 0;     // bytes a plan may take on it (the fit rule's usable)
  double needed = 0;     // the plan as given, on this GPU (total on the GPU)
  bool fits = false;     // needed <= usable
  // The cheapest flag set that fits (for a row that does not fit as given): found = false when nothing
  // on the ladder fits; flags as the exact text to add; the GPU and host totals of that plan.
  bool found = false;
  std::string flags;
  int64_t given_micro_batch = 0;  // > 0: flags change --micro-batch-size from this value
  double flag_device = 0, flag_host = 0;
};
// The fit table: a header (the fit rule), one row per GPU "<gpu> <usable GB> <needed GB> yes|no
// [<flags> (GPU x GB[, host y GB])]", and a footer naming what is not on the ladder.
// dp_size > 1: the table is for one GPU of that many data-parallel ranks (the footer says what is sharded).
std::vector<std::string> fit_table_lines(std::span<const FitRow> rows, double context_reserve, double arena_slack,
                                         int64_t dp_size = 1, bool distributed_optimizer = false,
                                         bool lighter_bases = false);  // --peft lora: the ladder's rung q
// --dry-run-gpu: the one line naming the cheapest flag set for that GPU.
std::string cheapest_flags_line(const FitRow& row);

}  // namespace pl::log
