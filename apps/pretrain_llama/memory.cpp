// pretrain_llama's memory plan before anything is allocated: the start-up check that it fits the device
// (and the host, for the optimizer offload), and --dry-run's plan and fit table.
#include "pretrain_llama.h"

#include <fmt/format.h>

#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/step_timer.h"
#include "model/accounting.h"
#include "model/hf_llama.h"
#include "model/lora.h"

namespace pl::pretrain {

namespace {

// The fit table's row for `gpu` (--dry-run; the start-up check's line on a GPU): the plan as given on it
// and the cheapest flag set (fit_plan.h).
log::FitRow fit_row(const FitRequest& req, const GpuSpec& gpu) {
  const FitResult f = cheapest_fit(req, gpu);
  return log::FitRow{.gpu = gpu.name,
                     .sm = gpu.sm,
                     .usable = f.usable,
                     .needed = f.as_given_total,
                     .fits = f.fits_as_given,
                     .found = f.found,
                     .flags = f.flags,
                     .given_micro_batch = f.micro_batch_changed ? req.micro_batch : 0,
                     .flag_device = f.device_total,
                     .flag_host = f.host_total};
}

// --peft lora: the recipes beside the given one whose plan stores the frozen base in fewer bytes at this run's
// shape (FP8 current scaling, NVFP4), heaviest first: the fit ladder's rung q. A recipe whose block rule the
// micro-batch breaks is left out.
std::vector<std::pair<std::string, PrecisionPlan>> lighter_bases(const RunSetup& s, const TrainConfig& t,
                                                                 const RunLayout& mopt) {
  std::vector<std::pair<std::string, PrecisionPlan>> out;
  if (!mopt.lora) return out;
  const auto stored = [&](const PrecisionPlan& p) {
    const MemoryPlan m = plan_memory(s.mc, t.micro_batch_size, t.seq_length, Device::CUDA, p, mopt, 0);
    return m.base_bf16 + m.base_quantized;
  };
  const double given = stored(s.plan);
  for (const char* name : {"bf16_with_fp8_current_scaling_mixed", "bf16_with_nvfp4_mixed"}) {
    const std::filesystem::path path = std::filesystem::path(s.recipe_path).parent_path() / (std::string(name) + ".json");
    std::error_code ec;
    if (name == s.recipe.name || !std::filesystem::is_regular_file(path, ec)) continue;
    PrecisionPlan p = make_precision_plan(s.mc, load_precision_recipe(path.string()));
    try {
      check_tokens_block_rule(p, t.micro_batch_size, t.seq_length);
    } catch (const Error&) {
      continue;
    }
    if (stored(p) < given) out.emplace_back(name, std::move(p));
  }
  return out;
}

// The plan's details issue 42 adds to the dry run: under LoRA the stored base by format and the adapters with
// their optimizer state; the activations under each recomputation; the host memory of streaming the weights.
void print_plan_details(const RunSetup& s, const Options& o, const MemoryPlan& mem, const RunLayout& mopt,
                        Device planned, const Logger& out) {
  const TrainConfig& t = o.train;
  if (mopt.lora) {
    std::string formats;
    for (QuantFormat f : s.plan.quantized_formats()) formats += (formats.empty() ? "" : "+") + std::string(quant_format_name(f));
    out->info("pretrain_llama | memory LoRA's frozen base: {:.2f} GB in BF16 (embedding, norms, LM head, the linears "
              "kept in BF16, the one-layer load scratch) + {:.2f} GB as the copies of its quantized linears, {}; the "
              "adapters' {:.1f} M parameters: {:.2f} GB with their gradients, master weights and Adam state",
              mem.base_bf16 / 1e9, mem.base_quantized / 1e9, formats.empty() ? "(none: a BF16 base)" : formats,
              static_cast<double>(lora_parameter_count(s.mc, *mopt.lora)) / 1e6,
              (mem.weights - mem.base_bf16 + mem.grads + mem.master + mem.optimizer) / 1e9);
  }
  const int64_t L = s.mc.num_layers;
  const auto activations = [&](const RecomputeConfig& rc) {
    RunLayout x = mopt;
    x.recompute = rc;
    return plan_memory(s.mc, t.micro_batch_size, t.seq_length, planned, s.plan, x, 0).activations / 1e9;
  };
  out->info("pretrain_llama | memory activations and scratch by recomputation: none {:.2f} GB, block {} (half the "
            "layers) {:.2f} GB, full (uniform 1) {:.2f} GB; this run ({}) {:.2f} GB",
            activations({}), L / 2, activations({RecomputeConfig::Method::Block, std::max<int64_t>(1, L / 2)}),
            activations(RecomputeConfig::full()), mopt.recompute.describe(), mem.activations / 1e9);
  const HfStreamingPeak peak = hf_streaming_host_peak(s.mc, mopt.lora.has_value());
  out->info("pretrain_llama | memory host peak of streaming the weights tensor by tensor (--init-from-hf, --load ... "
            "--finetune, convert_checkpoint --merge-lora): about {:.2f} GB (the largest tensor, {}, in FP32 with its "
            "BF16 bytes{}), never the model's {:.1f} GB of FP32 values",
            peak.bytes / 1e9, peak.largest, mopt.lora ? "; the base's largest linear assembled and rounded" : "",
            4.0 * static_cast<double>(s.mc.num_parameters()) / 1e9);
}

}  // namespace

// The plan must fit the device before anything is allocated; otherwise one line that names the
// biggest categories and the flags that shrink them. With the optimizer offloaded, the host must also
// have the offload's bytes available (on the CPU backend: both parts together).

void check_memory_fits(const MemoryPlan& p, const FitRequest& req, const TrainConfig& t, Device device, int sm) {
  const double host_avail = static_cast<double>(host_memory_available_bytes());
  const double host_need = p.host_total() + (device == Device::CPU ? p.total() : 0.0);
  PL_CHECK(!p.offload || host_avail == 0.0 || host_need < host_avail,
           "--optimizer-cpu-offload needs {:.1f} GB of host memory (master weights {:.1f} GB, optimizer state {:.1f} GB, "
           "pinned gradient copy {:.1f} GB, weight staging {:.2f} GB{}) but {:.1f} GB are available; use "
           "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, or a host with more memory",
           host_need / 1e9, p.master / 1e9, p.optimizer / 1e9, p.host_grads / 1e9, p.host_staging / 1e9,
           device == Device::CPU ? fmt::format(", the model on the CPU {:.1f} GB", p.total() / 1e9) : "",
           host_avail / 1e9);
  if (p.offload && device == Device::CPU) return;
  const double avail = device == Device::CPU ? host_avail : static_cast<double>(device_memory_info(device).free);
  // On the GPU the arena's slack and the margin it leaves free outside it: the fit rule's (model/fit_plan.h),
  // shared with --dry-run's fit table.
  const double slack =
      device == Device::CUDA ? device_fit_slack(static_cast<double>(device_memory_info(device).total)) : 0.0;
  if (avail == 0.0 || p.total() + slack < avail) return;
  std::string line = log::memory_does_not_fit_line(req.model->name, t.micro_batch_size, t.seq_length,
                                                   device_name(device), p.device_categories(), slack, avail,
                                                   !req.options.recompute.on());
  // On a GPU, the fit table's ladder for this GPU (its memory and compute capability), in the same line.
  if (device == Device::CUDA) {
    const GpuSpec here{"", "this GPU", static_cast<int64_t>(device_memory_info(device).total / 1048576), sm};
    line += "; " + log::cheapest_flags_line(fit_row(req, here));
  }
  fail("{}", line);
}

// --dry-run: the plan for the GPU unless --device cpu (for the --dry-run-gpu GPU's sm when given), then the
// fit table; nothing is allocated and no GPU is touched.
void print_dry_run(const RunSetup& s, const Options& o, const Logger& out) {
  const TrainConfig& t = o.train;
  const Device planned = t.device == "cpu" ? Device::CPU : Device::CUDA;
  const GpuSpec* gpu = o.dry_run_gpu.empty() ? nullptr : find_gpu(o.dry_run_gpu);
  RunLayout mopt = run_layout(o, s);
  if (gpu) mopt.gpu_sm = gpu->sm;
  const MemoryPlan mem = plan_memory(s.mc, t.micro_batch_size, t.seq_length, planned, s.plan, mopt,
                                     0 /* no GPU is opened: --dry-run-gpu's sm, else kPlanDefaultSm */);
  const MegatronParamCounts pc = megatron_param_counts(s.mc);
  out->info("pretrain_llama | dry run: {} ({}), recipe {}, micro-batch {} x seq {}, recompute {}, device {}", s.mc.name,
            s.model_source, s.recipe.name, t.micro_batch_size, t.seq_length, mopt.recompute.describe(), device_name(planned));
  if (t.data_parallel_size > 1)
    out->info("pretrain_llama | dry run for {} data-parallel ranks: the plan of one rank's GPU (rank 0){}",
              t.data_parallel_size,
              t.use_distributed_optimizer
                  ? fmt::format("; distributed optimizer: master weights and moments of {} of {} parameters",
                                shard_layout(s.mc.num_parameters(), mopt).shard, s.mc.num_parameters())
                  : std::string("; without --use-distributed-optimizer every rank holds the whole optimizer state"));
  if (gpu)
    out->info("pretrain_llama | dry run for GPU {} (--dry-run-gpu {}): sm_{}, {} MiB in total (nvidia-smi), {:.2f} GB "
              "usable by the plan",
              gpu->name, gpu->key, gpu->sm, gpu->total_mib, usable_device_bytes(gpu->total_bytes()) / 1e9);
  out->info("pretrain_llama | parameters: {:.2f} B (Megatron's count {:.2f} B)",
            static_cast<double>(s.mc.num_parameters()) / 1e9, pc.total() / 1e9);
  print_optimizer_state(t, out);
  for (const std::string& line : s.plan.describe()) out->info("pretrain_llama | plan   {}", line);
  if (const std::string line = fp8_primary_weights_line(s, mopt); !line.empty()) out->info("pretrain_llama | plan   {}", line);
  // The memory plan's rows (the offload's split into device and host when it is on).
  const log::OffloadRows offload{mem.host_grads, mem.host_staging, planned == Device::CUDA ? "GPU" : "CPU"};
  for (const std::string& line : log::memory_plan_lines(mem.categories(), mem.gemm_note, mem.optimizer_label,
                                                        mem.offload ? &offload : nullptr, mem.grads_label,
                                                        mem.weights_label))
    out->info("pretrain_llama | memory {}", line);
  if (planned == Device::CUDA)
    out->info("pretrain_llama | memory library workspaces: cuBLASLt 32 MiB + cuDNN attention backward, {} algorithm "
              "({}), estimated, + the packed Q/K/V scratch reserved should cuDNN refuse strided views of the qkv rows; "
              "the GPU run reports cuDNN's own figure and the layout it built",
              t.deterministic_mode ? "deterministic" : "non-deterministic",
              t.deterministic_mode ? "--deterministic-mode" : "the default, as Transformer Engine's");
  out->info("pretrain_llama | memory Megatron's theoretical weight and optimizer={:.2f} MB counts {:.0f} more "
            "parameters (a bias per norm; RMSNorm has none)",
            pc.total() * kWeightAndOptimizerBytesPerParam / 1048576.0,
            pc.total() - static_cast<double>(s.mc.num_parameters()));
  print_plan_details(s, o, mem, mopt, planned, out);
  if (const std::unique_ptr<observe::DownstreamEval> d = make_downstream_eval(o, s.mc, {}))
    out->info("pretrain_llama | memory --downstream-eval's evaluation model: {:.3f} GB beyond the plan above (its BF16 "
              "weights and one batch of its requests; the run reserves it beside the plan; not in the fit table)",
              d->planned_bytes(planned, 0) / 1e9);
  FitRequest req{&s.mc, t.micro_batch_size, t.seq_length, &s.plan, run_layout(o, s),
                 t.use_precision_aware_optimizer, o.fp8_param_gather};
  const std::vector<std::pair<std::string, PrecisionPlan>> lighter = lighter_bases(s, t, req.options);
  for (const auto& [name, plan] : lighter) req.lighter_bases.emplace_back(name, &plan);
  std::vector<log::FitRow> rows;
  for (const GpuSpec& g : known_gpus()) rows.push_back(fit_row(req, g));
  for (const std::string& line : log::fit_table_lines(rows, kCudaContextReserve, kArenaSlack, t.data_parallel_size,
                                                        t.use_distributed_optimizer, !lighter.empty()))
    out->info("pretrain_llama | fit    {}", line);
  if (gpu) out->info("pretrain_llama | {}", log::cheapest_flags_line(fit_row(req, *gpu)));
}

}  // namespace pl::pretrain
