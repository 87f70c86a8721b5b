#pragma once
// Which GPUs a run fits, and the cheapest switches that make it fit: pure functions of the memory plan
// (plan_memory), used by pretrain_llama --dry-run (the fit table, --dry-run-gpu) and, for the one fit
// rule, by the start-up check on a real GPU.
//
// The fit rule. A plan fits a GPU of `total` bytes (what nvidia-smi reports) when
//     plan.total() <= usable(total) = total - kCudaContextReserve - device_fit_slack(total)
// device_fit_slack(total) = kArenaSlack + device_memory_margin(total) is what the start-up check adds to
// the plan before comparing with the opened GPU's free bytes (which already exclude the CUDA context),
// so --dry-run and the start-up check apply the same rule; the dry run, having no GPU, subtracts an
// estimate of the context instead of reading free bytes.
//
// The ladder. The cheapest flag set is the first of these, cumulative and starting from the user's
// flags (nothing the user gave is removed), whose plan fits, in order of the throughput they cost:
//   a. the flags as given;
//   g. with more than one data-parallel rank (RunLayout::dp_size), --use-distributed-optimizer when
//      not given: the master weights and moments sharded over the ranks (a reduce-scatter and an
//      all-gather per step instead of one all-reduce: the same bytes on the wire), and every later rung
//      builds on it;
//   p. --fp8-param-gather (FP8 primary weights, when the plan has FP8 weights, it is off and nothing
//      turns it off): no BF16 copy of the FP8 layers' weights; the same codes, scales and losses, a BF16
//      rounding of one layer's master per layer per step (bandwidth only);
//   b. BF16 moments (--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16):
//      storage only; the AdamW math is the same FP32 element math, no throughput cost;
//   m. b + --main-grads-dtype bf16: the gradients accumulated over the micro-batches in BF16 (each
//      micro-batch's group of gradients computed in FP32 scratch and added in, rounded once): half the
//      gradient bytes, no throughput cost, BF16 rounding of the accumulated gradient (one rank only: not
//      implemented with data parallelism);
//   c. b + a smaller --micro-batch-size, halved down to 1 (only if it is > 1; --global-batch-size is
//      unchanged, so an iteration runs more, smaller micro-batches): the same work in smaller GEMMs,
//      less GEMM efficiency; the largest micro-batch that fits is taken;
//   d. c + --optimizer-cpu-offload: AdamW runs on the host each step, its copies overlapped with the
//      last backward; cheap when an iteration has many micro-batches (large global batches); FP8 primary
//      weights are then off (the master is on the host), unless --fp8-param-gather was given: then d and f
//      are left out;
//   e. c + recomputation: the fewest layers that fit, as Megatron's block method (the first N layers' forwards
//      run again in the backward, about a third more compute for each of them, every step; N found by bisection:
//      the plan falls as N grows), all of them spelled --recompute-granularity full (uniform 1: the same memory
//      and work as block L); a recomputation the user gave is kept as given;
//   f. c + --optimizer-cpu-offload + e's recomputation;
//   q. --peft lora only: a lighter format for the frozen base (FitRequest::lighter_bases, e.g. the FP8 recipe,
//      then the NVFP4 one, under a BF16 base), each at the given micro-batch, then smaller ones, then with e's
//      recomputation, each point without then with b's BF16 moments: last, since it changes the numerics of the
//      base (--recipe NAME first in the flags).
// In d, e and f the micro-batch is also halved from the given one down to 1, and the largest that fits
// is taken (offload saves the same bytes at any micro-batch; a larger micro-batch costs less). Each point
// of c, d, e and f is tried on b, then on m: BF16 main grads are added only where b's point does not fit.
// With more than one data-parallel rank, d and f are left out (the offload is not implemented with data
// parallelism). A rung that changes nothing (the flag was given) is skipped.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/model_config.h"
#include "model/memory_plan.h"
#include "model/precision_plan.h"

namespace pl {

// Room in the device arena beyond the planned categories, for ops' grow-only scratch (cuDNN and CUB
// workspaces, reduction buffers). pretrain_llama reserves the arena as the plan plus this.
inline constexpr double kArenaSlack = 1.0 * 1024 * 1024 * 1024;
// What the CUDA context and the cuBLASLt and cuDNN handles take on a GPU before the plan is reserved
// (the start-up check sees it as memory already not free). An estimate, to be checked on a GPU: a CUDA
// 12/13 context with lazy loading is a few hundred MiB; 0.5 GiB is that with some room.
inline constexpr double kCudaContextReserve = 0.5 * 1024 * 1024 * 1024;

// Bytes a GPU of `total_device_bytes` must have free beyond the plan: kArenaSlack +
// device_memory_margin(total) (core/tensor.h). The start-up check compares plan + this with free bytes.
double device_fit_slack(double total_device_bytes);
// Bytes of a GPU of `total_device_bytes` a plan may take: total - kCudaContextReserve - device_fit_slack.
double usable_device_bytes(double total_device_bytes);
// The fit rule: plan.total() (the device part) <= usable_device_bytes(total).
bool plan_fits(const MemoryPlan& plan, double total_device_bytes);

// A GPU of the fit table: its memory as nvidia-smi reports it (MiB) and its compute capability, which
// decides how the quantized GEMMs run (native or emulated) and so their scratch.
struct GpuSpec {
  const char* key;   // --dry-run-gpu NAME
  const char* name;  // the table's name
  int64_t total_mib;
  int sm;
  double total_bytes() const { return static_cast<double>(total_mib) * 1048576.0; }
};
// H100 80 GB, H200 141 GB, B200 180 GB, GB300 288 GB, RTX 5090 32 GB (fit_plan.cpp says where each
// figure comes from).
std::span<const GpuSpec> known_gpus();
// The GPU named `key` (h100, h200, b200, gb300, rtx5090), or nullptr.
const GpuSpec* find_gpu(std::string_view key);
// "h100, h200, b200, gb300, rtx5090" (for the unknown-name error).
std::string known_gpu_keys();

// What the user asked for: the model, the micro-batch, the sequence, the precision plan and the
// RunLayout their flags give (gpu_sm is replaced by each GPU's), and whether
// --use-precision-aware-optimizer was already given (so the flag text does not repeat it).
struct FitRequest {
  const ModelConfig* model = nullptr;
  int64_t micro_batch = 1;
  int64_t seq_length = 1;
  const PrecisionPlan* plan = nullptr;
  RunLayout options;
  bool precision_aware_given = false;
  bool fp8_param_gather_given = false;  // --fp8-param-gather on the command line (then never turned off)
  // --peft lora: recipes whose plan stores the frozen base in fewer bytes, lightest last (rung q).
  std::vector<std::pair<std::string, const PrecisionPlan*>> lighter_bases{};
};

// One point of the ladder: the micro-batch and options it plans with, and the flags to add.
struct FitCandidate {
  char rung = 'a';  // a, g, p, b, m, c, d, e, f, q as in the header
  int64_t micro_batch = 1;
  RunLayout options;
  bool search_recompute = false;  // rungs e, f (and q's last): options.recompute is found when planned
  std::string recipe{};           // rung q: the base's recipe (else the request's plan)
  const PrecisionPlan* plan = nullptr;
};

// The cheapest flag set for one GPU.
struct FitResult {
  bool fits_as_given = false;  // rung a fits: nothing to add
  bool found = false;          // some rung fits (false: "does not fit with any of these")
  FitCandidate chosen;         // the rung that fits (meaningful when found)
  // The exact command-line text to add to the user's flags ("" when it fits as given), e.g.
  // "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --optimizer-cpu-offload".
  // When the micro-batch changes it starts with "--micro-batch-size N", which replaces the given one.
  std::string flags;
  bool micro_batch_changed = false;
  double device_total = 0, host_total = 0;  // the chosen plan's total() and host_total()
  double usable = 0;                        // usable_device_bytes(gpu.total_bytes())
  double as_given_total = 0;                // the plan as given on this GPU (rung a's total())
};

// The memory plan of the request at `micro_batch` with `options` on `gpu` (its sm; CUDA storage). The one
// plan_memory call the ladder makes; loss_micro_batches is scaled so the global batch stays the same.
// `plan`: the precision plan (nullptr: the request's).
MemoryPlan plan_for_gpu(const FitRequest& r, int64_t micro_batch, const RunLayout& options, const GpuSpec& gpu,
                        const PrecisionPlan* plan = nullptr);
// The ladder for `gpu`: the first candidate whose plan fits.
FitResult cheapest_fit(const FitRequest& r, const GpuSpec& gpu);
// The flag text that turns the request into `c` (what FitResult::flags holds for it).
std::string candidate_flags(const FitRequest& r, const FitCandidate& c);

}  // namespace pl
