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
std::vector<std::string> memory_plan_lines(std::span<const double, 7> bytes, const std::string& gemm_note,
                                           const std::string& optimizer_label = "",
                                           const OffloadRows* offload = nullptr);
// The one line of a plan that does not fit: the biggest categories and the flags that shrink them.
// slack: op scratch and free margin beyond the plan; recompute_off: --recompute none. bytes as on the
// device (with offload: master and optimizer 0).
std::string memory_does_not_fit_line(const std::string& model, int64_t micro_batch, int64_t seq_length,
                                     const char* device, std::span<const double, 7> bytes, double slack,
                                     double available, bool recompute_off);

}  // namespace pl::log
