#include "log/plan_log.h"

#include <fmt/format.h>

#include <numeric>

namespace pl::log {

std::vector<std::string> memory_plan_lines(std::span<const double, 7> bytes, const std::string& gemm_note,
                                           const std::string& optimizer_label, const OffloadRows* offload,
                                           const std::string& grads_label, const std::string& weights_label) {
  static constexpr const char* kNames[7] = {"weights (bf16)",          "gradients (fp32)",
                                            "master weights (fp32)",   "optimizer state (Adam m, v fp32)",
                                            "activations and scratch", "quantized copies",
                                            "library workspaces"};
  auto row = [](const char* name, double b) {
    return fmt::format("{:<34} {:>10.3f} GB  {:>12.2f} MB", name, b / 1e9, b / 1048576.0);
  };
  std::vector<std::string> out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string name = i == 3 && !optimizer_label.empty() ? optimizer_label
                       : i == 1 && !grads_label.empty()   ? grads_label
                       : i == 0 && !weights_label.empty() ? weights_label
                                                          : kNames[i];
    if (offload && (i == 2 || i == 3)) name.insert(name.size() - 1, ", host");
    out.push_back(row(name.c_str(), bytes[i]));
    if (offload && i == 3) {
      out.push_back(row("gradient copy (host, pinned)", offload->host_grads));
      out.push_back(row("weight staging (host, pinned)", offload->host_staging));
    }
  }
  out.push_back(row("weights and optimizer (Megatron's category)", bytes[0] + bytes[1] + bytes[2] + bytes[3]));
  const double all = std::accumulate(bytes.begin(), bytes.end(), 0.0);
  if (!offload) {
    out.push_back(row("total", all));
  } else {
    out.push_back(row(fmt::format("total on the {}", offload->device).c_str(), all - bytes[2] - bytes[3]));
    out.push_back(row("total on the host", bytes[2] + bytes[3] + offload->host_grads + offload->host_staging));
  }
  if (!gemm_note.empty()) out.push_back(gemm_note);
  return out;
}

std::string memory_does_not_fit_line(const std::string& model, int64_t micro_batch, int64_t seq_length,
                                     const char* device, std::span<const double, 7> bytes, double slack,
                                     double available, bool recompute_off) {
  const double total = std::accumulate(bytes.begin(), bytes.end(), 0.0);
  std::string hint = "use a smaller --micro-batch-size or --seq-length";
  if (recompute_off && bytes[4] > 0.25 * total) hint = "--recompute-granularity full, or " + hint;
  return fmt::format(
      "{} at micro-batch {} x seq {} needs {:.1f} GB on the {} (weights+grads+master+optimizer {:.1f} GB, activations "
      "{:.1f} GB, quantized copies {:.1f} GB, workspaces {:.1f} GB, op scratch and free margin {:.1f} GB) but {:.1f} GB "
      "are free; {}",
      model, micro_batch, seq_length, (total + slack) / 1e9, device, (bytes[0] + bytes[1] + bytes[2] + bytes[3]) / 1e9,
      bytes[4] / 1e9, bytes[5] / 1e9, bytes[6] / 1e9, slack / 1e9, available / 1e9, hint);
}

namespace {

// "<flags> (GPU x GB, host y GB)" for a row whose cheapest set is found; the host part only when it
// offloads; a changed micro-batch is said to replace the given one (the flag cannot be repeated).
std::string flag_set(const FitRow& r) {
  std::string s = fmt::format("{} (GPU {:.2f} GB", r.flags, r.flag_device / 1e9);
  if (r.flag_host > 0) s += fmt::format(", host {:.2f} GB", r.flag_host / 1e9);
  if (r.given_micro_batch > 0) s += fmt::format("; --micro-batch-size replaces the given {}", r.given_micro_batch);
  return s + ")";
}

constexpr const char* kNothingFits =
    "does not fit with any of these (FP8 primary weights, BF16 moments, BF16 main grads, a smaller "
    "--micro-batch-size, --optimizer-cpu-offload, recomputing every layer{})";

}  // namespace

std::vector<std::string> fit_table_lines(std::span<const FitRow> rows, double context_reserve, double arena_slack,
                                         int64_t dp_size, bool distributed_optimizer, bool lighter_bases) {
  std::vector<std::string> out;
  const char* bases = lighter_bases ? ", a lighter base format" : "";
  const bool dp = dp_size > 1;
  out.push_back(fmt::format(
      "fit on one GPU{}: usable = total (nvidia-smi) - {:.1f} GiB CUDA context (an estimate) - {:.1f} GiB arena slack - "
      "max(2 GiB, 3%) kept free; needed = the plan as given on that GPU's sm; GB = 1e9 bytes",
      dp ? fmt::format(" of {} data-parallel ranks", dp_size) : "", context_reserve / 1073741824.0,
      arena_slack / 1073741824.0));
  out.push_back(fmt::format("{:<22} {:>9} {:>9}  {:<4}  {}", "GPU", "usable GB", "needed GB", "fits",
                            dp ? fmt::format("cheapest flags that fit (in order: distributed optimizer, BF16 "
                                             "moments, BF16 main grads, smaller micro-batch, recompute (fewest "
                                             "layers){})",
                                             bases)
                               : fmt::format("cheapest flags that fit (in order: FP8 primary weights, BF16 moments, "
                                             "BF16 main grads, smaller micro-batch, offload, recompute (fewest "
                                             "layers){})",
                                             bases)));
  for (const FitRow& r : rows) {
    const std::string line = fmt::format("{:<22} {:>9.2f} {:>9.2f}  ", fmt::format("{} (sm_{})", r.gpu, r.sm),
                                         r.usable / 1e9, r.needed / 1e9);
    out.push_back(line + (r.fits ? "yes" : "no    " + (r.found ? flag_set(r) : fmt::format(kNothingFits, bases))));
  }
  if (!dp)
    out.push_back("one data-parallel rank; a run on N GPUs: --dry-run-world-size N (under mpirun: its world size)");
  else if (distributed_optimizer)
    out.push_back(fmt::format("every GPU holds the whole BF16 weights and FP32 gradients and 1/{} of the master weights "
                              "and Adam's moments (--use-distributed-optimizer)",
                              dp_size));
  else
    out.push_back("every GPU holds the whole model and optimizer state (plain data parallelism; "
                  "--use-distributed-optimizer shards the master weights and moments)");
  return out;
}

std::string cheapest_flags_line(const FitRow& r) {
  const std::string head = fmt::format("cheapest flags for {} ({:.2f} GB usable): ", r.gpu, r.usable / 1e9);
  if (r.fits) return head + fmt::format("as given (GPU {:.2f} GB)", r.needed / 1e9);
  return head + (r.found ? flag_set(r) : fmt::format(kNothingFits, ""));
}

}  // namespace pl::log
