#include "model/fit_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace pl {

double device_fit_slack(double total_device_bytes) {
  return kArenaSlack + device_memory_margin(total_device_bytes);
}

double usable_device_bytes(double total_device_bytes) {
  return total_device_bytes - kCudaContextReserve - device_fit_slack(total_device_bytes);
}

bool plan_fits(const MemoryPlan& plan, double total_device_bytes) {
  return plan.total() <= usable_device_bytes(total_device_bytes);
}

namespace {

// The total memory nvidia-smi prints ("<used>MiB / <total>MiB"), as seen in public nvidia-smi
// outputs pasted in GitHub issues and logs (found with a text search over public repositories):
//   H100 80GB HBM3 (SXM)  81559 MiB   sm_90
//   H200                 143771 MiB   sm_90
//   B200                 183359 MiB   sm_100
//   GeForce RTX 5090      32607 MiB   sm_120
// GB300 (its B300 GPU: sm_103, compute capability 10.3 as public B300 reports print it; NVFP4/MXFP8 GEMMs
// native as on sm_100): no public nvidia-smi line was found; 288 GiB is NOMINAL (the 288 GB of HBM3e as 8 stacks of 36 GiB). What
// nvidia-smi prints is likely less (an NVML mock profile of NVIDIA's says 284672 MiB for "NVIDIA GB300
// NVL"; cloud listings say 275-279 GB per GPU); replace it when a GB300 run reports its total.
constexpr std::array<GpuSpec, 5> kGpus = {{
    {"h100", "H100 80GB", 81559, 90},
    {"h200", "H200 141GB", 143771, 90},
    {"b200", "B200 180GB", 183359, 100},
    {"gb300", "GB300 288GB", 288 * 1024, 103},  // nominal, see above
    {"rtx5090", "RTX 5090 32GB", 32607, 120},
}};

// The micro-batches the ladder tries below `mbs`, largest first: halved while even, else 1 (each one
// divides the given micro-batch, so it divides the global batch too).
std::vector<int64_t> micro_batches_from(int64_t mbs) {
  std::vector<int64_t> out{mbs};
  while (out.back() > 1) out.push_back(out.back() % 2 == 0 ? out.back() / 2 : 1);
  return out;
}

}  // namespace

std::span<const GpuSpec> known_gpus() { return kGpus; }

const GpuSpec* find_gpu(std::string_view key) {
  for (const GpuSpec& g : kGpus)
    if (key == g.key) return &g;
  return nullptr;
}

std::string known_gpu_keys() {
  std::string s;
  for (const GpuSpec& g : kGpus) s += (s.empty() ? "" : ", ") + std::string(g.key);
  return s;
}

MemoryPlan plan_for_gpu(const FitRequest& r, int64_t micro_batch, const RunLayout& options, const GpuSpec& gpu,
                        const PrecisionPlan* plan) {
  RunLayout o = options;
  o.gpu_sm = gpu.sm;
  // The global batch stays: loss_micro_batches x micro_batch samples per iteration.
  o.loss_micro_batches = std::max<int64_t>(1, options.loss_micro_batches * r.micro_batch / micro_batch);
  return plan_memory(*r.model, micro_batch, r.seq_length, Device::CUDA, plan ? *plan : *r.plan, o, 0);
}

std::string candidate_flags(const FitRequest& r, const FitCandidate& c) {
  std::vector<std::string> f;
  if (!c.recipe.empty()) f.push_back("--recipe " + c.recipe);
  if (c.micro_batch != r.micro_batch) f.push_back(fmt::format("--micro-batch-size {}", c.micro_batch));
  if (c.options.distributed_optimizer && !r.options.distributed_optimizer) f.push_back("--use-distributed-optimizer");
  const bool moments = c.options.exp_avg != r.options.exp_avg || c.options.exp_avg_sq != r.options.exp_avg_sq;
  const bool offload = c.options.optimizer_offload && !r.options.optimizer_offload;
  const bool main_grads = c.options.bf16_main_grads && !r.options.bf16_main_grads;
  if ((moments || offload || main_grads) && !r.precision_aware_given) f.push_back("--use-precision-aware-optimizer");
  if (c.options.exp_avg != r.options.exp_avg) f.push_back("--exp-avg-dtype bf16");
  if (c.options.exp_avg_sq != r.options.exp_avg_sq) f.push_back("--exp-avg-sq-dtype bf16");
  if (c.options.fp8_primary_weights && !r.options.fp8_primary_weights) f.push_back("--fp8-param-gather");
  if (main_grads) f.push_back("--main-grads-dtype bf16");
  if (offload) f.push_back("--optimizer-cpu-offload");
  if (c.options.recompute != r.options.recompute) f.push_back(c.options.recompute.flags());
  return fmt::format("{}", fmt::join(f, " "));
}

namespace {

// Rungs e and f: the fewest recomputed layers with which c fits `gpu`, written into c.options.recompute (false:
// not even all of them). Block N keeps N - 1 fewer activation sets than none (layer 0's input is kept anyway), so
// the plan falls as N grows: bisection over N in [2, L]; block L has the memory and work of uniform 1, spelled
// --recompute-granularity full. A recomputation the user gave is kept as it is.
bool fewest_recomputed_layers(const FitRequest& r, FitCandidate& c, const GpuSpec& gpu) {
  const auto fits = [&](const RecomputeConfig& rc) {
    RunLayout o = c.options;
    o.recompute = rc;
    return plan_fits(plan_for_gpu(r, c.micro_batch, o, gpu, c.plan), gpu.total_bytes());
  };
  const int64_t L = r.model->num_layers;
  const auto block = [&](int64_t n) {
    return n >= L ? RecomputeConfig::full() : RecomputeConfig{RecomputeConfig::Method::Block, n};
  };
  if (r.options.recompute.on()) return fits(c.options.recompute);
  if (!fits(block(L))) return false;
  int64_t lo = std::min<int64_t>(2, L), hi = L;  // block(hi) fits
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(block(mid)))
      hi = mid;
    else
      lo = mid + 1;
  }
  c.options.recompute = block(hi);
  return true;
}

}  // namespace

FitResult cheapest_fit(const FitRequest& r, const GpuSpec& gpu) {
  FitResult res;
  res.usable = usable_device_bytes(gpu.total_bytes());
  // The rungs' options, cumulative over the user's (a flag the user gave is never turned off). With more
  // than one data-parallel rank the distributed optimizer comes first (it shards the master weights and
  // moments: the biggest saving, and Megatron needs it for the precision-aware optimizer), and the offload
  // rungs are left out (not implemented with data parallelism).
  // An explicit --fp8-param-gather stays on: the rungs that would turn it off (the distributed optimizer,
  // the offload) are left out.
  // --peft lora: no BF16 main grads and no offload rungs (refused with it: its optimizer state is the adapters').
  const bool data_parallel = r.options.dp_size > 1, keep_primary = r.fp8_param_gather_given,
             lora = r.options.lora.has_value();
  RunLayout sharded = r.options;
  sharded.distributed_optimizer = sharded.distributed_optimizer || (data_parallel && !keep_primary);
  RunLayout primary = sharded;
  primary.fp8_primary_weights = true;
  const bool primary_rung = !fp8_primary_weights_in_effect(*r.plan, sharded) &&
                            fp8_primary_weights_in_effect(*r.plan, primary);
  if (!primary_rung) primary = sharded;
  RunLayout bf16 = primary;
  bf16.exp_avg = bf16.exp_avg_sq = DType::BF16;
  RunLayout grads = bf16;  // (BF16 main grads are not implemented with data parallelism: no rung m there)
  grads.bf16_main_grads = grads.bf16_main_grads || (!data_parallel && !lora);
  const bool grads_rung = grads.bf16_main_grads != bf16.bf16_main_grads;
  std::vector<FitCandidate> ladder = {{'a', r.micro_batch, r.options}};
  if (sharded.distributed_optimizer != r.options.distributed_optimizer) ladder.push_back({'g', r.micro_batch, sharded});
  if (primary_rung) ladder.push_back({'p', r.micro_batch, primary});
  ladder.push_back({'b', r.micro_batch, bf16});
  if (grads_rung) ladder.push_back({'m', r.micro_batch, grads});
  // Each later point first on b, then (where rung m exists) on m: BF16 main grads only where they are needed.
  const auto add = [&](char rung, int64_t mbs, bool offload, bool recompute) {
    for (const RunLayout* base : {&bf16, &grads}) {
      if (base == &grads && !grads_rung) break;
      RunLayout o = *base;
      o.optimizer_offload = o.optimizer_offload || offload;
      ladder.push_back({rung, mbs, o, recompute});
    }
  };
  const std::vector<int64_t> smaller = micro_batches_from(r.micro_batch);
  for (size_t i = 1; i < smaller.size(); ++i) add('c', smaller[i], false, false);
  const bool offload_allowed = !data_parallel && !keep_primary && !lora;
  for (const auto& [rung, offload, recompute] : {std::tuple{'d', true, false}, std::tuple{'e', false, true},
                                                 std::tuple{'f', true, true}})
    if (offload_allowed || !offload)
      for (int64_t m : smaller) add(rung, m, offload, recompute);
  for (const auto& [recipe, plan] : lora ? r.lighter_bases : decltype(r.lighter_bases){})
    for (bool recompute : {false, true})
      for (int64_t m : smaller)
        for (const RunLayout* o : {&primary, &bf16}) ladder.push_back({'q', m, *o, recompute, recipe, plan});
  for (FitCandidate& c : ladder) {
    if (c.search_recompute && !fewest_recomputed_layers(r, c, gpu)) continue;
    const MemoryPlan p = plan_for_gpu(r, c.micro_batch, c.options, gpu, c.plan);
    if (c.rung == 'a') res.as_given_total = p.total();
    if (!plan_fits(p, gpu.total_bytes())) continue;
    res.found = true;
    res.fits_as_given = c.rung == 'a';
    res.chosen = c;
    res.flags = candidate_flags(r, c);
    res.micro_batch_changed = c.micro_batch != r.micro_batch;
    res.device_total = p.total();
    res.host_total = p.host_total();
    return res;
  }
  return res;
}

}  // namespace pl
