// pretrain_llama: pretrain a Llama-shaped decoder with Megatron-Bridge's recipe and log format.
//
//   pretrain_llama --model configs/models/llama_tiny.json --device cpu --disable-fp4 --train-iters 30
//                  --global-batch-size 8 --micro-batch-size 2 --seq-length 128
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <tuple>

#include "app_main.h"
#include "config/model_config.h"
#include "config/paths.h"
#include "config/precision_recipe.h"
#include "config/train_config.h"
#include "core/error.h"
#include "core/step_timer.h"
#include "io/file_checks.h"
#include "data/data_pipeline.h"
#include "data/tokenizer_record.h"
#include "parallel/communicator.h"
#include "parallel/world.h"
#if defined(PL_WITH_CUDA)
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>

#include "backend/cuda/attention_graph.h"
#include "backend/cuda/device_state.h"
#include "backend/cuda/gemm.h"
#endif
#include "log/megatron_log.h"
#include "log/plan_log.h"
#include "model/accounting.h"
#include "model/fit_plan.h"
#include "model/hf_llama.h"
#include "model/llama.h"
#include "model/precision_plan.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_config(void);

namespace {

using namespace pl;

// --exit-signal-handler: the first SIGTERM/SIGINT is recorded for the trainer (read after each iteration);
// a second one restores the default action and re-raises it, so the process ends at once.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

struct Options {
  TrainConfig train;
  std::string model = "llama3_8b";
  std::string recipe = "bf16_with_nvfp4_mixed";  // the playbook's
  bool disable_fp4 = false;
  std::string recompute = "none";
  bool dry_run = false;
  std::string dry_run_gpu;  // --dry-run-gpu: plan for this GPU of the fit table (model/fit_plan.h)
  int64_t dry_run_world_size = 0;  // --dry-run-world-size: plan one GPU of this many data-parallel ranks
  int64_t dp_rank = 0;             // this process's data-parallel rank (the World's rank)
  bool print_library_versions = false;
  // Checkpoints (Megatron's flags): --save, --save-interval, --load, --keep-last; --exit-interval
  // lives in TrainConfig because the trainer stops there.
  std::string save, load;
  int64_t save_interval = 0;
  int64_t keep_last = 0;
  bool exit_signal_handler = false;  // Megatron's --exit-signal-handler (on by default with --save)
  std::string init_from_hf;  // a Hugging Face Llama directory: config and weights come from it
  ModelShapeOverrides shape;  // Megatron's --num-layers, --hidden-size, ... over the --model config
  // Megatron's --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16 over the recipe (-1 = not given).
  int64_t bf16_layers_at_start = -1, bf16_layers_at_end = -1;
  data::DataConfig data;
};

// Every line of the run goes through one stdout logger with the bare "%v" pattern, so Megatron's
// formats come out to the character and are flushed line by line.
std::shared_ptr<spdlog::logger> make_output(const std::string& name) {
  auto out = spdlog::stdout_logger_mt(name);
  out->set_pattern("%v");
  out->flush_on(spdlog::level::info);
  return out;
}

void add_flags(CLI::App& app, Options& o) {
  TrainConfig& t = o.train;
  app.add_flag("--disable-fp4", o.disable_fp4, "Run the BF16 baseline: switches the recipe to bf16_mixed");
  app.add_option("--train-iters", t.train_iters, "Number of training iterations")->capture_default_str();
  app.add_option("--warmup-iters", t.warmup_iters, "Learning-rate warmup iterations (linear from 0)")
      ->capture_default_str();
  app.add_option("--global-batch-size", t.global_batch_size, "Samples per iteration (all micro-batches)")
      ->capture_default_str();
  app.add_option("--micro-batch-size", t.micro_batch_size, "Samples per forward/backward pass")
      ->capture_default_str();
  app.add_option("--seq-length", t.seq_length, "Tokens per sample")->capture_default_str();
  app.add_option("--model", o.model, "Model config: a name in configs/models/ or a path to a .json")
      ->capture_default_str();
  app.add_option("--num-layers", o.shape.num_layers, "Override the model config's num_layers (Megatron's flag)");
  app.add_option("--hidden-size", o.shape.hidden_size, "Override the model config's hidden_size");
  app.add_option("--ffn-hidden-size", o.shape.ffn_hidden_size, "Override the model config's ffn_hidden_size");
  app.add_option("--num-attention-heads", o.shape.num_attention_heads,
                 "Override the model config's num_attention_heads (kv_channels becomes hidden/heads unless "
                 "--kv-channels is given)");
  app.add_option("--num-query-groups", o.shape.num_query_groups, "Override the model config's num_query_groups (KV heads)");
  app.add_option("--kv-channels", o.shape.kv_channels, "Override the model config's kv_channels (head dim)");
  app.add_option("--num-layers-at-start-in-bf16", o.bf16_layers_at_start,
                 "Override the recipe's num_layers_at_start_in_bf16 (turns first_last_layers_bf16 on)");
  app.add_option("--num-layers-at-end-in-bf16", o.bf16_layers_at_end,
                 "Override the recipe's num_layers_at_end_in_bf16 (turns first_last_layers_bf16 on; 0 quantizes "
                 "the last layers too)");
  app.add_option("--recipe", o.recipe, "Precision recipe: a name in configs/recipes/ or a path to a .json")
      ->capture_default_str();
  app.add_option("--device", t.device, "auto | cpu | cuda")->capture_default_str();
  app.add_option("--seed", t.seed, "Seed of the parameter initialisation")
      ->check(pl::app::kNonNegativeInteger)  // a uint64 would silently wrap "-1"
      ->capture_default_str();
  app.add_option("--lr", t.lr, "Peak learning rate")->capture_default_str();
  app.add_option("--min-lr", t.min_lr, "Final learning rate of the cosine decay")->capture_default_str();
  app.add_option("--log-interval", t.log_interval, "Iterations per log line")->capture_default_str();
  app.add_option("--threads", t.threads, "CPU threads for OpenMP and OpenBLAS (0 = all cores)")
      ->capture_default_str();
  app.add_option("--max-nan-iterations", t.max_consecutive_nan_iterations,
                 "Stop after this many consecutive iterations with a non-finite loss or grad norm")
      ->capture_default_str();
  app.add_option("--log-quant-stats-interval", t.quant_stats_interval,
                 "Every N iterations, one 'quant stats' line per quantized linear layer and operand: amax, "
                 "saturated fraction, underflowed-block fraction, relative error (0 = off)")
      ->capture_default_str();
  app.add_option("--recompute", o.recompute, "none | full (keep each layer's input, recompute its forward in backward)")
      ->capture_default_str();
  app.add_option("--init-from-hf", o.init_from_hf,
                 "Start from a Hugging Face Llama directory (config.json + safetensors): the model config comes "
                 "from its config.json (--model, if also given, must agree on every shape field) and its weights "
                 "replace the random initialisation");
  app.add_flag("--dry-run", o.dry_run,
               "Print the memory plan (GB per category and total) and a fit table (which GPUs it fits, and the "
               "cheapest flags that make it fit where it does not) and exit; touches no GPU");
  app.add_option("--dry-run-gpu", o.dry_run_gpu,
                 "With --dry-run: plan for this GPU (its compute capability) and name the cheapest flags that "
                 "fit it: " + known_gpu_keys());
  app.add_option("--save", o.save, "Directory to save checkpoints in (DIR/iter_0000010/, "
                 "DIR/latest_checkpointed_iteration.txt); the last iteration run is always saved");
  app.add_option("--save-interval", o.save_interval, "Also save every N iterations (needs --save)");
  app.add_option("--load", o.load, "Resume from a checkpoint: a --save directory (its latest checkpoint) or one "
                 "iter_ directory; verified before use");
  app.add_option("--exit-interval", t.exit_interval,
                 "Stop after the first iteration divisible by N, saving first when --save is given (0 = off)")
      ->capture_default_str();
  app.add_flag("--exit-signal-handler", o.exit_signal_handler,
               "Megatron's flag: on SIGTERM or SIGINT finish the current iteration, save a checkpoint (with --save) "
               "and exit 0; a second signal stops at once. On by default when --save is given");
  app.add_option("--keep-last", o.keep_last, "Keep only the newest K checkpoints in --save (0 = keep all)")
      ->capture_default_str();
  app.add_option("--data-path", o.data.data_path,
                 "Megatron indexed dataset(s): PREFIX (PREFIX.bin/.idx, e.g. corpus_text_document) or a blend "
                 "'W1 PREFIX1 W2 PREFIX2 ...'; without it, Megatron's mock data")
      ->expected(1, -1);
  app.add_option("--split", o.data.split, "Train/validation/test proportions of the documents (real data only)")
      ->capture_default_str();
  app.add_option("--data-cache-path", o.data.cache_path,
                 "Where GPTDataset index files are cached (default: <prefix>/cache/GPTDataset_indices)");
  app.add_option("--data-seed", o.data.seed, "Seed of the dataset shuffles (Bridge's dataset.random_seed)")
      ->capture_default_str();
  app.add_option("--eval-interval", t.eval_interval, "Iterations between validation runs")->capture_default_str();
  app.add_option("--eval-iters", t.eval_iters,
                 "Global batches per validation run (0 = no validation, the playbook's setting)")
      ->capture_default_str();
  app.add_option("--timing-log-level", t.timing_log_level,
                 "Megatron's timers, printed after the iteration line of each log interval in ms per iteration: "
                 "0 = none; 1 = forward-backward and the optimizer's phases; 2 = also forward-compute, "
                 "backward-compute, batch-generator and the time inside each op category (GEMMs by format, "
                 "attention, quantization, norms, ...)")
      ->capture_default_str();
  app.add_option("--timing-log-option", t.timing_log_option,
                 "How the timers are reported across ranks: max | minmax | all (one process: all equal)")
      ->capture_default_str();
  app.add_flag("--fp32-reference", t.fp32_reference,
               "CPU only: keep every activation in FP32 (no BF16 rounding), for numerics studies");
  app.add_flag("--use-precision-aware-optimizer", t.use_precision_aware_optimizer,
               "Megatron's flag: let the optimizer states below take lower-precision dtypes (one rank: its "
               "distributed optimizer is the whole state, so --use-distributed-optimizer is not needed)");
  app.add_option("--main-grads-dtype", t.main_grads_dtype,
                 "Megatron's flag: dtype of the main gradients, fp32 | bf16 (bf16: each micro-batch's FP32 gradients added "
                 "into BF16 main grads, rounded once)")
      ->capture_default_str();
  app.add_option("--main-params-dtype", t.main_params_dtype,
                 "Megatron's flag: dtype of the master weights, fp32 | fp16 (fp16: not implemented yet)")
      ->capture_default_str();
  app.add_option("--exp-avg-dtype", t.exp_avg_dtype,
                 "Megatron's flag: dtype of Adam's first moment, fp32 | fp16 | bf16 (fp16: not implemented yet)")
      ->capture_default_str();
  app.add_option("--exp-avg-sq-dtype", t.exp_avg_sq_dtype,
                 "Megatron's flag: dtype of Adam's second moment, fp32 | fp16 | bf16 (fp16: not implemented yet)")
      ->capture_default_str();
  app.add_flag("--optimizer-cpu-offload", t.optimizer_cpu_offload,
               "Megatron's flag: keep the FP32 master weights and Adam's moments in host memory and run AdamW on "
               "the host (gradients copied down during the last backward, updated weights copied up); needs "
               "--use-precision-aware-optimizer, as Megatron");
  app.add_option("--optimizer-offload-fraction", t.optimizer_offload_fraction,
                 "Megatron's flag: the fraction of the optimizer offloaded to the host (1.0 only: a split is not "
                 "implemented yet)")
      ->capture_default_str();
  app.add_flag("--deterministic-mode", t.deterministic_mode,
               "Megatron's flag: choose code that has deterministic execution (slower): cuDNN's deterministic "
               "attention backward. Default: cuDNN's fastest backward, as Transformer Engine's default");
  app.add_flag("--cuda-sync-every-launch", t.cuda_sync_every_launch,
               "Debugging: synchronize the GPU after every kernel launch, so an asynchronous fault names the op "
               "that caused it (as CUDA_LAUNCH_BLOCKING=1; slow). No effect on the CPU");
  app.add_flag("--use-distributed-optimizer", t.use_distributed_optimizer,
               "Megatron's flag: shard the FP32 master weights and Adam's moments over the data-parallel ranks "
               "(gradients reduce-scattered, BF16 weights all-gathered after each step)");
  app.add_flag("--overlap-grad-reduce", t.overlap_grad_reduce,
               "Megatron's flag: reduce each bucket of gradients on the communication stream as soon as the last "
               "micro-batch's backward has finished it");
  app.add_flag("--overlap-param-gather", t.overlap_param_gather,
               "Megatron's flag: overlap the weight all-gather after each step with the next forward (needs "
               "--use-distributed-optimizer and --overlap-grad-reduce): each bucket's weights are waited for, and "
               "a layer's quantized copies made, when the forward reaches them");
  app.add_option("--ddp-bucket-size", t.ddp_bucket_size,
                 "Megatron's flag: elements per gradient bucket with --overlap-grad-reduce (0 = Megatron's default "
                 "max(40000000, 1000000 x data-parallel size))")
      ->capture_default_str();
  app.add_option("--dry-run-world-size", o.dry_run_world_size,
                 "With --dry-run: plan one GPU of a run with this many data-parallel ranks (default: the MPI world "
                 "this process was started in, 1 without mpirun)");
  app.add_flag("--print-library-versions", o.print_library_versions,
               "Print the versions of the CUDA driver and of the CUDA libraries this process loads, and exit");
}

// --print-library-versions (scripts/gpu_check.sh): what the loaded libraries report, which is what ran,
// whatever their file names say. Needs no GPU. NCCL and NVRTC are looked up with dlopen (this program
// does not link them); "not loadable" when the library path lacks them. Exit 0, or 1 without CUDA.
int print_library_versions() {
#if defined(PL_WITH_CUDA)
  const auto dotted = [](long long v, int major_div, int minor_div, int minor_mod) {
    return fmt::format("{}.{}", v / major_div, v / minor_div % minor_mod);
  };
  int rt = 0, drv = 0;
  const cudaError_t rt_err = cudaRuntimeGetVersion(&rt), drv_err = cudaDriverGetVersion(&drv);
  std::printf("pretrain_llama | CUDA runtime %s | CUDA driver API %s\n",
              rt_err == cudaSuccess ? dotted(rt, 1000, 10, 100).c_str() : cudaGetErrorString(rt_err),
              drv_err == cudaSuccess ? (drv ? dotted(drv, 1000, 10, 100).c_str() : "none (no driver)")
                                     : cudaGetErrorString(drv_err));
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    std::printf("pretrain_llama | devices: none (%s)\n", cudaGetErrorString(e));
  } else {
    for (int d = 0; d < devices; ++d) {
      cudaDeviceProp p{};
      if (cudaGetDeviceProperties(&p, d) == cudaSuccess)
        std::printf("pretrain_llama | device %d: %s, sm_%d%d, %.1f GiB\n", d, p.name, p.major, p.minor,
                    static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    }
  }
  const size_t lt = cublasLtGetVersion();  // major*10000 + minor*100 + patch
  std::printf("pretrain_llama | cuBLASLt %zu.%zu.%zu\n", lt / 10000, lt / 100 % 100, lt % 100);
  const size_t dnn = cudnnGetVersion();  // cuDNN 9: major*10000 + minor*100 + patch
  std::printf("pretrain_llama | cuDNN %zu.%zu.%zu (built against %d.%d.%d)\n", dnn / 10000, dnn / 100 % 100,
              dnn % 100, CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
  if (void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL)) {
    int v = 0;
    using Fn = int (*)(int*);
    if (auto fn = reinterpret_cast<Fn>(dlsym(h, "ncclGetVersion")); fn && fn(&v) == 0)  // major*10000+minor*100+patch
      std::printf("pretrain_llama | NCCL %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
  } else {
    std::printf("pretrain_llama | NCCL not loadable (libnccl.so.2)\n");
  }
  void* nvrtc = nullptr;
  for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"})
    if ((nvrtc = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
  int nv_major = 0, nv_minor = 0;
  using NvrtcVersion = int (*)(int*, int*);
  const auto nvrtc_fn = nvrtc ? reinterpret_cast<NvrtcVersion>(dlsym(nvrtc, "nvrtcVersion")) : nullptr;
  if (nvrtc_fn && nvrtc_fn(&nv_major, &nv_minor) == 0)
    std::printf("pretrain_llama | NVRTC %d.%d\n", nv_major, nv_minor);
  else
    std::printf("pretrain_llama | NVRTC not loadable (libnvrtc.so.13)\n");
  return 0;
#else
  std::printf("pretrain_llama | this build has no CUDA backend: no CUDA libraries to report\n");
  return 1;
#endif
}

// --device: cuda needs a usable device; auto takes one if present, else the CPU, and says which.
Device resolve_device(const TrainConfig& t, const std::shared_ptr<spdlog::logger>& out) {
  if (t.device == "cpu") return Device::CPU;
  std::string why;
  const int n = cuda_device_count(&why);
  if (t.device == "cuda") {
    PL_CHECK(n > 0, "--device cuda: no usable CUDA device ({})", why);
    return Device::CUDA;
  }
  if (n > 0) return Device::CUDA;
  out->info("pretrain_llama | --device auto -> cpu (no usable CUDA device: {})", why);
  return Device::CPU;
}

int configure_threads(int requested) {
  const int n = requested > 0 ? requested : omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
  return n;
}

// MemAvailable from /proc/meminfo in bytes (0 when unknown).
double available_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 0.0;
}

// The memory plan's rows (the offload's split into device and host when it is on).
std::vector<std::string> plan_lines(const MemoryPlan& mem, Device device) {
  const log::OffloadRows offload{mem.host_grads, mem.host_staging, device == Device::CUDA ? "GPU" : "CPU"};
  return log::memory_plan_lines(mem.categories(), mem.gemm_note, mem.optimizer_label, mem.offload ? &offload : nullptr,
                                mem.grads_label);
}

// The plan must fit the device before anything is allocated; otherwise one line that names the
// biggest categories and the flags that shrink them. With the optimizer offloaded, the host must also
// have the offload's bytes available (on the CPU backend: both parts together).
log::FitRow fit_row(const FitRequest& req, const GpuSpec& gpu);

void check_memory_fits(const MemoryPlan& p, const FitRequest& req, const TrainConfig& t, Device device, int sm) {
  const ModelConfig& m = *req.model;
  const double host_avail = available_host_bytes();
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
  std::string line = log::memory_does_not_fit_line(m.name, t.micro_batch_size, t.seq_length, device_name(device),
                                                   p.device_categories(), slack, avail, !req.options.recompute);
  // On a GPU, the fit table's ladder for this GPU (its memory and compute capability), in the same line.
  if (device == Device::CUDA) {
    const GpuSpec here{"", "this GPU", static_cast<int64_t>(device_memory_info(device).total / 1048576), sm};
    line += "; " + log::cheapest_flags_line(fit_row(req, here));
  }
  fail("{}", line);
}

void validate_checkpoint_flags(const Options& o, const CLI::App& app) {
  PL_CHECK(!app.count("--save-interval") || o.save_interval >= 1, "--save-interval must be >= 1, got {}",
           o.save_interval);
  PL_CHECK(!app.count("--save-interval") || !o.save.empty(), "--save-interval {} needs --save DIR", o.save_interval);
  PL_CHECK(o.keep_last >= 0, "--keep-last must be >= 0 (0 = keep all), got {}", o.keep_last);
  PL_CHECK(o.keep_last == 0 || !o.save.empty(), "--keep-last {} needs --save DIR", o.keep_last);
  PL_CHECK(!app.count("--save") || !o.save.empty(), "--save needs a directory");
  PL_CHECK(!app.count("--load") || !o.load.empty(), "--load needs a directory");
}

// --load: the verified checkpoint, or none when --load names the --save directory and it holds no
// checkpoint yet. Megatron then warns and starts from random (megatron/training/checkpointing.py,
// _load_base_checkpoint); we do so only in that resume-or-start case, because a --load that points
// at the wrong directory should not silently train from scratch.
// With data parallelism rank 0 reads every byte of the checkpoint (its checksums); the others check the
// manifest, the metadata and the sizes, and read only their ranges when restoring.
std::optional<VerifiedCheckpoint> find_checkpoint(const Options& o, const ModelConfig& mc, const std::string& recipe,
                                                  const parallel::World& world, const std::shared_ptr<spdlog::logger>& out) {
  if (o.load.empty()) return std::nullopt;
  std::error_code ec;
  if (!o.save.empty() && std::filesystem::weakly_canonical(o.load, ec) == std::filesystem::weakly_canonical(o.save, ec) &&
      checkpoint_dir_is_empty(o.load)) {
    for (const std::string& line : log::no_checkpoint_lines(o.load, kCheckpointTracker)) out->info("{}", line);
    return std::nullopt;
  }
  VerifiedCheckpoint c = verify_checkpoint(o.load, world.rank() == 0);
  for (const std::string& note : compare_checkpoint_with_run(c, mc, recipe, o.train))
    out->info("pretrain_llama | checkpoint: {}", note);
  return c;
}

// The run's data (mock unless --data-path), sized for training and validation, with one summary line
// per dataset and split.
data::TrainingData build_data(const data::DataConfig& flags, const ModelConfig& mc, const TrainConfig& t,
                              const std::shared_ptr<spdlog::logger>& out) {
  const auto t0 = std::chrono::steady_clock::now();
  data::TrainingData d(data::data_config_for_run(flags, mc.vocab_size, t.seq_length,
                                                 {t.train_samples(), t.valid_samples(), t.test_samples()}));
  for (const std::string& line : d.summary()) out->info("pretrain_llama | data: {}", line);
  PL_CHECK(d.recorded_vocab_size() <= mc.vocab_size,
           "{} says the data was tokenized with a vocabulary of {}, but model {} has vocab_size {}: use a model config "
           "whose vocab_size covers it (e.g. llama_tiny_bytes for the byte tokenizer)",
           d.recorded_vocab_source(), d.recorded_vocab_size(), mc.name, mc.vocab_size);
  out->info("pretrain_llama | data: indices ready in {:.0f} ms; validation {}",
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
            t.eval_iters > 0 ? fmt::format("every {} iterations, {} batches of {} samples", t.eval_interval, t.eval_iters,
                                           t.global_batch_size)
                             : std::string("off (--eval-iters 0)"));
  return d;
}

// Micro-batches of split `s`; an id the model cannot embed is reported with the sample it came from
// (data tokenized for a larger vocabulary than the model's).
BatchFn batches_of(const data::TrainingData& d, data::Split s, int64_t micro_batch, int64_t vocab_size) {
  return [&d, s, micro_batch, vocab_size](int64_t first, int64_t micro, std::span<int32_t> tok,
                                          std::span<int32_t> lab) {
    d.micro_batch(s, first, micro, micro_batch, tok, lab);
    const int64_t seq = static_cast<int64_t>(tok.size()) / micro_batch;
    for (size_t k = 0; k < tok.size(); ++k) {
      const int32_t bad = tok[k] < 0 || tok[k] >= vocab_size ? tok[k] : (lab[k] < 0 || lab[k] >= vocab_size ? lab[k] : 0);
      PL_CHECK(bad == 0, "data: sample {} of the {} split holds token id {}, outside the model's vocabulary [0, {}): "
               "the data was tokenized for another vocabulary (see its .tokenizer.json, or use a model config with "
               "a larger vocab_size)",
               first + micro * micro_batch + static_cast<int64_t>(k) / seq, data::split_name(s), bad, vocab_size);
    }
  };
}

// The flag rules CLI11 cannot express; one line naming the flag each.
void validate_flags(const Options& o, const CLI::App& app) {
  const TrainConfig& t = o.train;
  validate_train_config(t);
  validate_checkpoint_flags(o, app);
  PL_CHECK(!(app.count("--eval-interval") && t.eval_iters == 0),
           "--eval-interval {} needs --eval-iters N > 0 (validation is off by default, as in the playbook)",
           t.eval_interval);
  PL_CHECK(o.data.data_path.empty() ? !app.count("--split") && !app.count("--data-cache-path") : true,
           "--split and --data-cache-path apply to --data-path data (mock data always uses split 1,1,1)");
  for (const char* flag : {"--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                           "--num-query-groups", "--kv-channels"})
    PL_CHECK(!app.count(flag) || app.get_option(flag)->as<int64_t>() >= 1, "{} must be >= 1, got {}", flag,
             app.get_option(flag)->as<std::string>());
  PL_CHECK(!(o.shape.any() && !o.init_from_hf.empty()),
           "{} cannot be combined with --init-from-hf (the Hugging Face weights fix the model's shape)",
           o.shape.describe());
  PL_CHECK(o.recompute == "none" || o.recompute == "full", "--recompute must be none or full, got '{}'", o.recompute);
  PL_CHECK(!app.count("--dry-run-world-size") || o.dry_run, "--dry-run-world-size {} needs --dry-run",
           o.dry_run_world_size);
  PL_CHECK(!app.count("--dry-run-world-size") || o.dry_run_world_size >= 1, "--dry-run-world-size must be >= 1, got {}",
           o.dry_run_world_size);
  if (app.count("--dry-run-gpu")) {
    PL_CHECK(o.dry_run, "--dry-run-gpu {} needs --dry-run (it plans without a GPU)", o.dry_run_gpu);
    PL_CHECK(find_gpu(o.dry_run_gpu) != nullptr, "--dry-run-gpu: unknown GPU '{}' (known: {})", o.dry_run_gpu,
             known_gpu_keys());
    PL_CHECK(o.train.device != "cpu", "--dry-run-gpu {} plans a GPU; it cannot be combined with --device cpu",
             o.dry_run_gpu);
  }
}

// What the flags resolve to before any device is touched: the model, the recipe and its plan.
struct RunSetup {
  ModelConfig mc;
  std::string model_source;  // where the shape came from, for the banner
  PrecisionRecipe recipe;
  std::string recipe_path;
  std::string recipe_note;  // the flags that changed the recipe, for the banner
  PrecisionPlan plan;
};

RunSetup resolve_model_and_plan(Options& o, const CLI::App& app, const char* argv0) {
  RunSetup s;
  if (o.disable_fp4) {
    if (app.count("--recipe") && o.recipe != "bf16_mixed")
      s.recipe_note = fmt::format(" | --disable-fp4 overrides --recipe {}", o.recipe);
    o.recipe = "bf16_mixed";
  }
  const bool from_hf = !o.init_from_hf.empty();
  const std::string model_path = from_hf ? o.init_from_hf + "/config.json, Hugging Face"
                                         : resolve_config("models", o.model, argv0);
  s.recipe_path = resolve_config("recipes", o.recipe, argv0);
  s.mc = from_hf ? hf_model_config_for_run(o.init_from_hf, app.count("--model") ? resolve_config("models", o.model, argv0) : "")
                 : apply_shape_overrides(load_model_config(model_path), o.shape);
  s.model_source = from_hf ? model_path : s.mc.file;
  s.recipe = load_precision_recipe(s.recipe_path);
  for (auto [flag, value, field] : {std::tuple{"--num-layers-at-start-in-bf16", o.bf16_layers_at_start,
                                               &s.recipe.num_layers_at_start_in_bf16},
                                    std::tuple{"--num-layers-at-end-in-bf16", o.bf16_layers_at_end,
                                               &s.recipe.num_layers_at_end_in_bf16}}) {
    if (!app.count(flag)) continue;
    PL_CHECK(value >= 0, "{} must be >= 0, got {}", flag, value);
    if (!s.recipe.first_last_layers_bf16) {
      s.recipe.first_last_layers_bf16 = true;
      s.recipe.num_layers_at_start_in_bf16 = s.recipe.num_layers_at_end_in_bf16 = 0;
    }
    *field = value;
    s.recipe_note += fmt::format(" | {} {}", flag, value);
  }
  s.plan = make_precision_plan(s.mc, s.recipe);
  check_tokens_block_rule(s.plan, o.train.micro_batch_size, o.train.seq_length);
  return s;
}

// --save must not be, contain or lie inside anything the run reads (io/file_checks.h): the model and
// recipe configs, the Hugging Face directory, the data's .bin/.idx/.tokenizer.json. --load may be --save
// (that is how Megatron resumes) or lie inside it (one iter_ directory).
void check_save_apart_from_inputs(const Options& o, const RunSetup& s) {
  if (o.save.empty()) return;
  std::vector<FlagPath> inputs;
  if (o.init_from_hf.empty()) inputs.push_back({"--model", s.mc.file});
  else inputs.push_back({"--init-from-hf", o.init_from_hf});
  inputs.push_back({"--recipe", s.recipe_path});
  if (!o.data.data_path.empty())
    for (const std::string& p : data::parse_data_path(o.data.data_path).prefixes)
      for (const std::string& f : {p + ".bin", p + ".idx", data::tokenizer_record_path(p)})
        inputs.push_back({"--data-path", f});
  check_outputs_apart_from_inputs(inputs, {{"--save", o.save}});
}

// The precision-aware optimizer's one banner line (only when --use-precision-aware-optimizer is given,
// so default logs are unchanged).
void print_optimizer_state(const TrainConfig& t, const std::shared_ptr<spdlog::logger>& out) {
  if (!t.use_precision_aware_optimizer) return;
  out->info("pretrain_llama | optimizer state (--use-precision-aware-optimizer): main grads {}, master weights {}, "
            "exp_avg {}, exp_avg_sq {} (one rank: its distributed optimizer holds the whole state)",
            t.main_grads_dtype, t.main_params_dtype, t.exp_avg_dtype, t.exp_avg_sq_dtype);
  if (t.optimizer_cpu_offload)
    out->info("pretrain_llama | optimizer CPU offload (--optimizer-cpu-offload, fraction {}): FP32 master weights and "
              "Adam's moments in host memory, AdamW on the host over the shared element math; gradients copied to "
              "the host as each layer's are final in the last micro-batch",
              t.optimizer_offload_fraction);
}

RunLayout model_options(const Options& o) {
  const TrainConfig& t = o.train;
  RunLayout m;
  m.recompute = o.recompute == "full";
  m.quant_telemetry = t.quant_stats_interval > 0;
  m.loss_micro_batches = t.num_micro_batches();  // the loss is read once per iteration
  m.deterministic_attention = t.deterministic_mode;
  const OptimizerConfig oc = optimizer_config(t);  // validates the precision-aware optimizer's flags
  m.exp_avg = oc.exp_avg_dtype;
  m.exp_avg_sq = oc.exp_avg_sq_dtype;
  m.optimizer_offload = t.optimizer_cpu_offload;
  m.bf16_main_grads = t.main_grads_dtype == "bf16";
  m.dp_size = t.data_parallel_size;
  m.dp_rank = o.dp_rank;
  m.distributed_optimizer = t.use_distributed_optimizer;
  return m;
}

// The --dry-run fit table's row for `gpu`: the plan as given on it and the cheapest flag set (fit_plan.h).
log::FitRow fit_row(const FitRequest& req, const GpuSpec& gpu) {
  const FitResult f = cheapest_fit(req, gpu);
  log::FitRow row;
  row.gpu = gpu.name;
  row.sm = gpu.sm;
  row.usable = f.usable;
  row.needed = f.as_given_total;
  row.fits = f.fits_as_given;
  row.found = f.found;
  row.flags = f.flags;
  row.given_micro_batch = f.micro_batch_changed ? req.micro_batch : 0;
  row.flag_device = f.device_total;
  row.flag_host = f.host_total;
  return row;
}

// --dry-run: the plan for the GPU unless --device cpu (for the --dry-run-gpu GPU's sm when given), then the
// fit table; nothing is allocated and no GPU is touched.
void print_dry_run(const RunSetup& s, const Options& o, const std::shared_ptr<spdlog::logger>& out) {
  const TrainConfig& t = o.train;
  const Device planned = t.device == "cpu" ? Device::CPU : Device::CUDA;
  const GpuSpec* gpu = o.dry_run_gpu.empty() ? nullptr : find_gpu(o.dry_run_gpu);
  RunLayout mopt = model_options(o);
  if (gpu) mopt.gpu_sm = gpu->sm;
  const MemoryPlan mem = plan_memory(s.mc, t.micro_batch_size, t.seq_length, planned, s.plan, mopt,
                                     0 /* no GPU is opened: --dry-run-gpu's sm, else kPlanDefaultSm */);
  const MegatronParamCounts pc = megatron_param_counts(s.mc);
  out->info("pretrain_llama | dry run: {} ({}), recipe {}, micro-batch {} x seq {}, recompute {}, device {}", s.mc.name,
            s.model_source, s.recipe.name, t.micro_batch_size, t.seq_length, o.recompute, device_name(planned));
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
  for (const std::string& line : plan_lines(mem, planned)) out->info("pretrain_llama | memory {}", line);
  if (planned == Device::CUDA)
    out->info("pretrain_llama | memory library workspaces: cuBLASLt 32 MiB + cuDNN attention backward, {} algorithm "
              "({}), estimated; the GPU run reports cuDNN's own figure",
              t.deterministic_mode ? "deterministic" : "non-deterministic",
              t.deterministic_mode ? "--deterministic-mode" : "the default, as Transformer Engine's");
  out->info("pretrain_llama | memory Megatron's theoretical weight and optimizer={:.2f} MB counts {:.0f} more "
            "parameters (a bias per norm; RMSNorm has none)",
            pc.total() * kWeightAndOptimizerBytesPerParam / 1048576.0,
            pc.total() - static_cast<double>(s.mc.num_parameters()));
  const FitRequest req{&s.mc, t.micro_batch_size, t.seq_length, &s.plan, model_options(o),
                       t.use_precision_aware_optimizer};
  std::vector<log::FitRow> rows;
  for (const GpuSpec& g : known_gpus()) rows.push_back(fit_row(req, g));
  for (const std::string& line : log::fit_table_lines(rows, kCudaContextReserve, kArenaSlack, t.data_parallel_size,
                                                        t.use_distributed_optimizer))
    out->info("pretrain_llama | fit    {}", line);
  if (gpu) out->info("pretrain_llama | {}", log::cheapest_flags_line(fit_row(req, *gpu)));
}

void print_model_and_plan(const RunSetup& s, const TrainConfig& t, Device device, int threads,
                          const std::shared_ptr<spdlog::logger>& out) {
  const ModelConfig& mc = s.mc;
  out->info("pretrain_llama | model {} ({}): {} layers, hidden {}, ffn {}, heads {} ({} kv groups, head dim {}), "
            "vocab {}, {:.3f} M parameters",
            mc.name, s.model_source, mc.num_layers, mc.hidden_size, mc.ffn_hidden_size, mc.num_attention_heads,
            mc.num_query_groups, mc.kv_channels, mc.vocab_size, static_cast<double>(mc.num_parameters()) / 1e6);
  out->info("pretrain_llama | device {} | OpenMP threads {} | BLAS {}", device_name(device), threads,
            openblas_get_config());
  out->info("pretrain_llama | recipe {} ({}){}{}", s.recipe.name, s.recipe_path, s.recipe_note,
            t.fp32_reference ? " | --fp32-reference: activations kept in FP32" : "");
  out->info("pretrain_llama | precision plan:");
  for (const std::string& line : s.plan.describe()) out->info("pretrain_llama |   {}", line);
  for (const std::string& note : s.plan.notes) out->info("pretrain_llama |   note: {}", note);
  if (device == Device::CPU && !s.plan.all_bf16())
    out->info("pretrain_llama |   note: {} GEMMs are emulated on the cpu (each operand dequantized exactly, FP32 "
              "BLAS accumulation, global scales as alpha): the recipe's numerics, not its speed",
              format_name(s.plan.quantized()));
}

// The GPU's state, opened once and owned by the caller: checks what the GPU run needs, applies the
// debugging and determinism switches and prints how each quantized format's GEMM runs.
DeviceStateHandle open_gpu(const RunSetup& s, const TrainConfig& t, OpContext& ctx,
                           const std::shared_ptr<spdlog::logger>& out) {
#if defined(PL_WITH_CUDA)
  check_gpu_gemm_rules(s.plan, s.mc, t.micro_batch_size, t.seq_length);
  PL_CHECK(cuda::attention_has_cudnn_frontend(),
           "this build's CUDA attention has no cudnn-frontend headers (run scripts/setup.sh, which installs "
           "nvidia-cudnn-frontend, then reconfigure), so it cannot train on the GPU; use --device cpu");
  DeviceStateHandle state = open_device_state(Device::CUDA);
  ctx.gpu = state.get();
  ctx.gpu->deterministic_attention = t.deterministic_mode;
  ctx.gpu->sync_every_launch = t.cuda_sync_every_launch;
  std::vector<QuantFormat> used;  // one banner line per quantized format of the plan, native or emulated
  for (const LinearPlan& p : s.plan.linears)
    if (p.quantized() && std::find(used.begin(), used.end(), *p.x) == used.end()) used.push_back(*p.x);
  for (const std::string& line : cuda::gemm_backend_lines(*ctx.gpu, used)) out->info("pretrain_llama |   {}", line);
  if (t.cuda_sync_every_launch)
    out->info("pretrain_llama |   debug: --cuda-sync-every-launch: the GPU is synchronized after every launch, so "
              "a fault names its op (slow: timings are not representative)");
  return state;
#else
  (void)s, (void)t, (void)ctx, (void)out;
  return open_device_state(Device::CUDA);  // a one-line error: no CUDA backend
#endif
}

void print_training_and_parameters(const ModelConfig& mc, const TrainConfig& t,
                                   const std::shared_ptr<spdlog::logger>& out) {
  out->info("pretrain_llama | training: {} iterations, global batch {} = {} micro-batches x {} samples x {} tokens, "
            "lr {:.3g} -> {:.3g} (cosine, warmup {}), seed {}, log interval {}",
            t.train_iters, t.global_batch_size, t.num_micro_batches(), t.micro_batch_size, t.seq_length, t.lr,
            t.min_lr, t.warmup_iters, t.seed, t.log_interval);
  print_optimizer_state(t, out);
  const MegatronParamCounts pc = megatron_param_counts(mc);
  std::string lines = log::parameter_lines(pc.transformer_layers, pc.embedding_layers,
                                           kWeightAndOptimizerBytesPerParam);
  for (size_t a = 0, b; a < lines.size(); a = b + 1) {
    b = lines.find('\n', a);
    if (b == std::string::npos) b = lines.size();
    out->info("{}", lines.substr(a, b - a));
  }
}

// The cuDNN attention graphs are built now (not in the first step), and the workspace cuDNN asks for
// in the chosen mode is allocated in the arena; the banner says which algorithm was built.
void prepare_gpu_attention(const OpContext& ctx, const ModelConfig& mc, const TrainConfig& t, double planned_workspace,
                           const std::shared_ptr<spdlog::logger>& out) {
#if defined(PL_WITH_CUDA)
  const cuda::AttentionPlan ap = cuda::attention_prepare(
      *ctx.gpu, AttentionShape{t.micro_batch_size, t.seq_length, mc.num_attention_heads, mc.num_query_groups, mc.kv_channels});
  out->info("pretrain_llama |   attention: cuDNN SDPA, backward algorithm {}{}; workspace forward {:.1f} MiB, "
            "backward {:.1f} MiB (planned {:.1f} MiB with cuBLASLt's 32 MiB)",
            ap.deterministic_backward ? "deterministic" : "non-deterministic",
            ap.deterministic_requested
                ? (ap.deterministic_backward ? " (--deterministic-mode)"
                                             : " (--deterministic-mode asked for the deterministic one; cuDNN has "
                                               "none for this shape on this GPU)")
                : " (the default, as Transformer Engine's; --deterministic-mode for the deterministic one)",
            static_cast<double>(ap.forward_workspace) / 1048576.0,
            static_cast<double>(ap.backward_workspace) / 1048576.0, planned_workspace / 1048576.0);
#else
  (void)ctx, (void)mc, (void)t, (void)planned_workspace, (void)out;
#endif
}

// What a checkpoint records about the run that wrote it (metadata.json).
RunDescription describe_run(const RunSetup& s, const Options& o, int argc, char** argv) {
  RunDescription desc;
  desc.model = s.mc;
  desc.recipe_name = s.recipe.name;
  desc.recipe_file = s.recipe_path;
  desc.plan = s.plan.describe();
  desc.train = o.train;
  desc.command_line.assign(argv, argv + argc);
  desc.data = o.data.data_path.empty()
                  ? std::string("Megatron MockGPTDataset (split 1,1,1)")
                  : fmt::format("--data-path {} --split {} --data-seed {}", fmt::join(o.data.data_path, " "), o.data.split,
                                o.data.seed);
  return desc;
}

void print_summary(const TrainResult& r, const TrainConfig& t, const TrainState& start,
                   const std::shared_ptr<spdlog::logger>& out) {
  if (r.loss.empty()) {
    out->info("pretrain_llama | summary: no iterations run (the checkpoint is at iteration {} of {})", start.iteration,
              t.train_iters);
    return;
  }
  if (t.exit_interval > 0 && r.state.iteration < t.train_iters)
    out->info("exiting program at iteration {}", r.state.iteration);  // Megatron's --exit-interval line
  const double tokens_per_iter = static_cast<double>(t.global_batch_size * t.seq_length);
  // tokens/s of the whole run, then per GPU (the data-parallel ranks) when there is more than one.
  const double tokens_per_s = tokens_per_iter / r.mean_seconds;
  const std::string per_gpu = t.data_parallel_size > 1
                                  ? fmt::format(" ({:.0f} tokens/s/GPU)", tokens_per_s / static_cast<double>(t.data_parallel_size))
                                  : std::string();
  out->info("pretrain_llama | summary: iterations {}-{} of {} (run by this process: {}-{}): mean step time {:.3f} s, "
            "{:.3f} MODEL_TFLOP/s/GPU, {:.0f} tokens/s{} | final lm loss {:.6E} | nan iterations {}",
            r.summary_first, r.summary_last, t.train_iters, r.first_iteration, r.state.iteration, r.mean_seconds,
            r.mean_tflops, tokens_per_s, per_gpu, r.loss.back(), r.nan_iterations);
}

// The start-up line of a data-parallel run (only with more than one rank or a data-parallel flag, so
// one-rank logs are unchanged).
void print_data_parallel(const parallel::World& world, const parallel::Communicator& comm, const TrainConfig& t,
                         const LlamaModel& model, size_t buckets, const std::shared_ptr<spdlog::logger>& out) {
  if (world.size() == 1 && !t.use_distributed_optimizer && !t.overlap_grad_reduce) return;
  const ShardLayout& sh = model.shard();
  out->info("pretrain_llama | data parallel: world size {}, data-parallel size {} ({}), {} micro-batches per rank per "
            "iteration (global batch {} = {} x {} samples x {} ranks), communicator {}",
            world.size(), t.data_parallel_size, world.describe(), t.num_micro_batches(), t.global_batch_size,
            t.num_micro_batches(), t.micro_batch_size, t.data_parallel_size, comm.name());
  out->info("pretrain_llama | data parallel: {}; gradients {} in FP32 (Megatron-Bridge's Llama 3 recipes: "
            "grad_reduce_in_fp32), {}",
            t.use_distributed_optimizer
                ? fmt::format("distributed optimizer: each rank owns {} of {} elements (padded from {}) of the master "
                              "weights and moments",
                              sh.shard, sh.padded, sh.num_params)
                : std::string("every rank holds the whole optimizer state (no --use-distributed-optimizer)"),
            t.use_distributed_optimizer ? "reduce-scattered" : "all-reduced",
            t.overlap_grad_reduce ? fmt::format("in {} bucket(s), each as soon as the last backward has finished it "
                                                "(--overlap-grad-reduce)", buckets)
                                  : std::string("in one bucket after the backward"));
}

// Errors every rank meets alike (the flags, the config files): printed once, by rank 0, when all ranks
// failed; otherwise each failing rank prints its own line. Every rank then returns 1 (no abort needed:
// no rank has started a collective). Returns the exit code, or 0 when every rank succeeded.
template <class Fn>
int agree_or_fail(const parallel::World& world, Fn&& fn) {
  std::string error;
  try {
    fn();
  } catch (const pl::Error& e) {
    error = e.what();
  }
  const double failed = world.all_reduce_sum(error.empty() ? 0.0 : 1.0);
  if (failed == 0.0) return 0;
  if (!error.empty() && (failed < world.size() || world.rank() == 0))
    app::print_error_line(world.size() > 1 && failed < world.size() ? fmt::format("pretrain_llama (rank {} of {})",
                                                                                   world.rank(), world.size()).c_str()
                                                                     : "pretrain_llama",
                          "error", error);
  return 1;
}

int run(const parallel::World& world, int argc, char** argv) {
  // A closed stdout (`| head`) must not kill the run before its checkpoint: writes then fail quietly.
  std::signal(SIGPIPE, SIG_IGN);
  Options o;
  CLI::App app{"pretrain_llama: pretrain a Llama-shaped model with a BF16/FP8/NVFP4 precision recipe; logs in "
               "Megatron-Bridge's format"};
  add_flags(app, o);
  if (const std::optional<int> rc = app::parse_command_line(app, argc, argv, "pretrain_llama")) return *rc;
  if (o.print_library_versions) return print_library_versions();
  const TrainConfig& t = o.train;
  // Data parallelism: one rank per GPU, the data-parallel size is the world's (--dry-run-world-size plans
  // another).
  o.train.data_parallel_size = o.dry_run && o.dry_run_world_size > 0 ? o.dry_run_world_size : world.size();
  o.dp_rank = o.dry_run ? 0 : world.rank();
  RunSetup setup;
  if (const int rc = agree_or_fail(world, [&] {
        validate_flags(o, app);
        setup = resolve_model_and_plan(o, app, argv[0]);
        check_save_apart_from_inputs(o, setup);
      }))
    return rc;
  const ModelConfig& mc = setup.mc;
  // Megatron prints the start-up lines from rank 0 (print_rank_0) and the iteration lines from the last
  // rank (print_rank_last): `out` is rank 0's; the trainer chooses its own rank for `lines`.
  auto out = make_output("pretrain_llama");
  auto lines = make_output("pretrain_llama.lines");
  if (world.rank() != 0) out->set_level(spdlog::level::off);
  if (o.dry_run) {
    print_dry_run(setup, o, out);
    return 0;
  }

  // --save is claimed now, not at the first save hours in: a directory we can write, locked against a
  // second run (rank 0 writes it; every rank learns of a failure and exits 1).
  std::optional<SaveDirectoryLock> save_lock;
  if (!o.save.empty())
    if (const int rc = agree_or_fail(world, [&] {
          if (world.rank() == 0) save_lock.emplace(o.save);
        }))
      return rc;

  const Device device = resolve_device(t, out);
  // The node's GPU of this rank (its local rank), before the device state opens a context on it.
  if (device == Device::CUDA) parallel::select_local_device(world);
  PL_CHECK(!(t.fp32_reference && device == Device::CUDA), "--fp32-reference is a CPU-only mode (use --device cpu)");
  const int threads = configure_threads(t.threads);
  OpContext ctx;
  ctx.device = device;
  ctx.round_bf16 = !t.fp32_reference;
  print_model_and_plan(setup, t, device, threads, out);
  // The GPU's state outlives the model and every op.
  const DeviceStateHandle gpu_state = device == Device::CUDA ? open_gpu(setup, t, ctx, out) : DeviceStateHandle{};
  const std::unique_ptr<parallel::Communicator> comm = parallel::make_communicator(world, ctx);
  print_training_and_parameters(mc, t, out);

  const RunLayout mopt = model_options(o);
  const MemoryPlan mem = plan_memory(mc, t.micro_batch_size, t.seq_length, device, setup.plan, mopt, device_sm(ctx));
  check_memory_fits(mem, FitRequest{&mc, t.micro_batch_size, t.seq_length, &setup.plan, mopt,
                                    t.use_precision_aware_optimizer},
                    t, device, device_sm(ctx));
  // The cuBLASLt workspace (32 MiB of the plan's workspaces) was allocated with the device state.
  if (device == Device::CUDA) reserve_device_arena(device, mem.total() - 32.0 * 1024 * 1024 + kArenaSlack);
  // The checkpoint is verified (sizes, checksums, model shape) before anything is built from it.
  const std::optional<VerifiedCheckpoint> ckpt = find_checkpoint(o, mc, setup.recipe.name, world, out);
  const TrainState start = ckpt ? ckpt->state : TrainState{};
  if (ckpt) out->info("{}", log::loading_checkpoint_line(o.load, ckpt->iteration));
  // Megatron builds the dataset indices on rank 0 while the others wait, then the others load them from
  // the cache (two ranks building one cache file at once would race on its temporary).
  if (world.rank() != 0) world.barrier();
  const data::TrainingData dataset = build_data(o.data, mc, t, out);
  if (world.rank() == 0) world.barrier();

  LlamaModel model(mc, t.micro_batch_size, t.seq_length, ctx, setup.plan, mopt);
  model.set_communicator(comm.get());
  if (device == Device::CUDA) prepare_gpu_attention(ctx, mc, t, model.memory_plan().workspace, out);
  if (!o.init_from_hf.empty())
    out->info("pretrain_llama | {}", import_hf(o.init_from_hf, model).describe());
  else
    model.init_parameters(t.seed);

  const RunDescription desc = describe_run(setup, o, argc, argv);
  int64_t last_saved = -1;
  std::unique_ptr<Trainer> trainer;
  // Megatron's save points (megatron/training/training.py): every --save-interval iterations, and
  // when the run ends or exits (--exit-interval) unless that iteration was just saved.
  auto checkpoint = [&](const TrainState& st, bool last) {
    if (o.save.empty()) return;
    const bool interval = o.save_interval > 0 && st.iteration % o.save_interval == 0;
    if (!(interval || last) || st.iteration == last_saved) return;
    out->info("{}", log::saving_checkpoint_line(st.iteration, o.save));
    const SaveReport rep = save_checkpoint(o.save, o.keep_last, model, trainer->optimizer(), st, desc, {}, &world);
    last_saved = st.iteration;
    out->info("{}", log::saved_checkpoint_line(st.iteration, o.save, rep.path, rep.bytes, rep.seconds));
    for (const std::string& p : rep.pruned) out->info("pretrain_llama | --keep-last {}: removed {}", o.keep_last, p);
  };
  const auto eval_batches = [&](data::Split s) {
    return dataset.split(s) ? batches_of(dataset, s, t.micro_batch_size, mc.vocab_size) : BatchFn{};
  };
  trainer = std::make_unique<Trainer>(
      model, t, batches_of(dataset, data::Split::train, t.micro_batch_size, mc.vocab_size),
      [&](const std::string& line) { lines->info("{}", line); },
      EvalData{eval_batches(data::Split::valid), eval_batches(data::Split::test)}, checkpoint,
      DataParallelRanks{&world, comm.get()});
  print_data_parallel(world, *comm, t, model, trainer->gradient_buckets(), out);
  if (!o.save.empty())  // (every rank takes part in agree_or_fail; rank 0 holds the lock)
    if (const int rc = agree_or_fail(world, [&] {
          if (save_lock) save_lock->check_free_space(checkpoint_bytes(model, trainer->optimizer()));
        }))
      return rc;
  if (o.exit_signal_handler || !o.save.empty()) {
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGINT, on_stop_signal);
    trainer->set_stop_flag(&g_stop_signal);
    out->info("pretrain_llama | SIGTERM/SIGINT: finish the iteration, {}exit 0; a second signal stops at once "
              "(--exit-signal-handler{})",
              o.save.empty() ? "" : "save a checkpoint, ", o.exit_signal_handler ? "" : ", on because --save is given");
  }
  if (ckpt) {
    const auto t_load = std::chrono::steady_clock::now();
    restore_checkpoint(*ckpt, model, trainer->optimizer());
    const double secs = ckpt->seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    out->info("{}", log::loaded_checkpoint_line(o.load, ckpt->iteration, ckpt->path, 2.0 * ckpt->bytes, secs));
    last_saved = ckpt->iteration;
  }
  const TrainResult r = trainer->run(start);
  out->info("{}", log::final_memory_line(memory_stats(device)));
  // The summary comes from the rank that printed the iteration lines (its timings).
  if (world.rank() == world.size() - 1) print_summary(r, t, start, lines);
  return 0;
}

// Every rank runs `run`. An error after the ranks have started working together ends all of them: the
// failing rank prints its line (naming itself) and aborts the world (MPI_Abort, after ncclCommAbort), so no
// rank waits forever in a collective. One rank: the usual one line and exit code (app_main.h).
int run_rank(int argc, char** argv) {
  const parallel::World world(argc, argv);
  if (world.size() == 1) return run(world, argc, argv);
  const std::string who = fmt::format("pretrain_llama (rank {} of {})", world.rank(), world.size());
  try {
    return run(world, argc, argv);
  } catch (const pl::Error& e) {
    app::print_error_line(who.c_str(), "error", e.what());
    world.abort(1);
  } catch (const std::exception& e) {
    app::print_error_line(who.c_str(), "internal error", e.what());
    world.abort(3);
  }
}

}  // namespace

int main(int argc, char** argv) { return pl::app::guarded_main("pretrain_llama", run_rank, argc, argv); }
