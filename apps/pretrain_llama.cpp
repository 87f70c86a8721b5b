// pretrain_llama: pretrain a Llama-shaped decoder with Megatron-Bridge's recipe and log format.
//
//   pretrain_llama --model configs/models/llama_tiny.json --device cpu --disable-fp4 --train-iters 30
//                  --global-batch-size 8 --micro-batch-size 2 --seq-length 128
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include "config/model_config.h"
#include "config/paths.h"
#include "config/precision_recipe.h"
#include "config/train_config.h"
#include "core/error.h"
#include "data/mock_dataset.h"
#include "log/megatron_log.h"
#include "model/accounting.h"
#include "model/llama.h"
#include "model/precision_plan.h"
#include "train/trainer.h"

extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_config(void);

namespace {

using namespace pl;

struct Options {
  TrainConfig train;
  std::string model = "llama3_8b";
  std::string recipe = "bf16_with_nvfp4_mixed";  // the playbook's
  bool disable_fp4 = false;
};

// Every line of the run goes through one stdout logger with the bare "%v" pattern, so Megatron's
// formats come out to the character and are flushed line by line.
std::shared_ptr<spdlog::logger> make_output() {
  auto out = spdlog::stdout_logger_mt("pretrain_llama");
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
  app.add_option("--recipe", o.recipe, "Precision recipe: a name in configs/recipes/ or a path to a .json")
      ->capture_default_str();
  app.add_option("--device", t.device, "auto | cpu | cuda")->capture_default_str();
  app.add_option("--seed", t.seed, "Seed of the parameter initialisation")->capture_default_str();
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
  app.add_flag("--fp32-reference", t.fp32_reference,
               "CPU only: keep every activation in FP32 (no BF16 rounding), for numerics studies");
}

Device resolve_device(const TrainConfig& t, const std::shared_ptr<spdlog::logger>& out) {
  if (t.device == "cuda")
    fail("--device cuda: the CUDA backend's ops are not implemented yet; use --device cpu");
  if (t.device == "auto")
    out->info("pretrain_llama | --device auto -> cpu (the CUDA backend's ops are not implemented yet)");
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

void check_host_memory(const ModelConfig& m, const TrainConfig& t) {
  // CPU backend: weights, grads, master, Adam m and v are all fp32 = 20 B/param.
  const double state = static_cast<double>(m.num_parameters()) * 20.0;
  const double tokens = static_cast<double>(t.micro_batch_size * t.seq_length);
  const double h = static_cast<double>(m.hidden_size), f = static_cast<double>(m.ffn_hidden_size);
  const double per_layer = tokens * (5 * h + static_cast<double>(m.qkv_dim() + m.q_dim()) + 3 * f) * 4.0;
  const double acts = per_layer * static_cast<double>(m.num_layers) +
                      tokens * (static_cast<double>(m.vocab_size) + 8 * h + 3 * f) * 4.0;
  const double avail = available_host_bytes();
  PL_CHECK(avail == 0.0 || state + acts < avail,
           "{} at micro-batch {} x seq {} needs about {:.1f} GB of host memory on the CPU backend (parameters and "
           "optimizer state {:.1f} GB, activations {:.1f} GB) but {:.1f} GB are available; use a smaller --model, "
           "--micro-batch-size or --seq-length",
           m.name, t.micro_batch_size, t.seq_length, (state + acts) / 1e9, state / 1e9, acts / 1e9, avail / 1e9);
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"pretrain_llama: pretrain a Llama-shaped model with a BF16/FP8/NVFP4 precision recipe; logs in "
               "Megatron-Bridge's format"};
  add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "pretrain_llama: error: %s (see --help)\n", e.what());
    return 2;
  }
  TrainConfig& t = o.train;
  validate_train_config(t);
  std::string recipe_note;
  if (o.disable_fp4) {
    if (app.count("--recipe") && o.recipe != "bf16_mixed")
      recipe_note = fmt::format(" | --disable-fp4 overrides --recipe {}", o.recipe);
    o.recipe = "bf16_mixed";
  }

  const std::string model_path = resolve_config("models", o.model, argv[0]);
  const std::string recipe_path = resolve_config("recipes", o.recipe, argv[0]);
  const ModelConfig mc = load_model_config(model_path);
  const PrecisionRecipe recipe = load_precision_recipe(recipe_path);
  const PrecisionPlan plan = make_precision_plan(mc, recipe);
  check_tokens_block_rule(plan, t.micro_batch_size, t.seq_length);

  auto out = make_output();
  const Device device = resolve_device(t, out);
  const int threads = configure_threads(t.threads);
  OpContext ctx;
  ctx.device = device;
  ctx.round_bf16 = !t.fp32_reference;

  out->info("pretrain_llama | model {} ({}): {} layers, hidden {}, ffn {}, heads {} ({} kv groups, head dim {}), "
            "vocab {}, {:.3f} M parameters",
            mc.name, model_path, mc.num_layers, mc.hidden_size, mc.ffn_hidden_size, mc.num_attention_heads,
            mc.num_query_groups, mc.kv_channels, mc.vocab_size, static_cast<double>(mc.num_parameters()) / 1e6);
  out->info("pretrain_llama | device {} | OpenMP threads {} | BLAS {}", device_name(device), threads,
            openblas_get_config());
  out->info("pretrain_llama | recipe {} ({}){}{}", recipe.name, recipe_path, recipe_note,
            t.fp32_reference ? " | --fp32-reference: activations kept in FP32" : "");
  out->info("pretrain_llama | precision plan:");
  for (const std::string& line : plan.describe()) out->info("pretrain_llama |   {}", line);
  for (const std::string& note : plan.notes) out->info("pretrain_llama |   note: {}", note);
  if (!plan.all_bf16())
    out->info("pretrain_llama |   note: {} GEMMs are emulated on the {} (each operand dequantized exactly, FP32 "
              "BLAS accumulation, global scales as alpha): the recipe's numerics, not its speed",
              format_name(plan.quantized_format()), device_name(device));

  out->info("pretrain_llama | training: {} iterations, global batch {} = {} micro-batches x {} samples x {} tokens, "
            "lr {:.3g} -> {:.3g} (cosine, warmup {}), seed {}, log interval {}",
            t.train_iters, t.global_batch_size, t.num_micro_batches(), t.micro_batch_size, t.seq_length, t.lr,
            t.min_lr, t.warmup_iters, t.seed, t.log_interval);
  const MegatronParamCounts pc = megatron_param_counts(mc);
  std::string lines = log::parameter_lines(pc.transformer_layers, pc.embedding_layers,
                                           kWeightAndOptimizerBytesPerParam);
  for (size_t a = 0, b; a < lines.size(); a = b + 1) {
    b = lines.find('\n', a);
    if (b == std::string::npos) b = lines.size();
    out->info("{}", lines.substr(a, b - a));
  }

  check_host_memory(mc, t);
  // Mock data as Megatron-Bridge builds it: NullTokenizer vocab 32000 (EOD 31999), or the model's
  // own vocab (EOD = vocab-1) when it is smaller.
  const int64_t data_vocab = std::min<int64_t>(mc.vocab_size, 32000);
  const auto t_data = std::chrono::steady_clock::now();
  data::MockGPTDataset dataset(data::MockDataConfig{data_vocab, data_vocab - 1, t.seq_length,
                                                    t.train_iters * t.global_batch_size, 1234});
  out->info("pretrain_llama | data: Megatron MockGPTDataset (vocab {}, eod {}, split 1,1,1, seed 1234): the run reads "
            "{} samples of the {} indexed, index built in {:.0f} ms",
            data_vocab, data_vocab - 1, t.train_iters * t.global_batch_size, dataset.size(),
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_data).count());

  LlamaModel model(mc, t.micro_batch_size, t.seq_length, ctx, plan);
  model.init_parameters(t.seed);
  Trainer trainer(
      model, t,
      [&](int64_t it, int64_t micro, std::span<int32_t> tok, std::span<int32_t> lab) {
        dataset.micro_batch(it, micro, t.global_batch_size, t.micro_batch_size, tok, lab);
      },
      [&](const std::string& line) { out->info("{}", line); });
  const TrainResult r = trainer.run();
  out->info("{}", log::final_memory_line(memory_stats(device)));
  const double tokens_per_iter = static_cast<double>(t.global_batch_size * t.seq_length);
  out->info("pretrain_llama | summary: iterations {}-{} of {}: mean step time {:.3f} s, {:.3f} MODEL_TFLOP/s/GPU, "
            "{:.0f} tokens/s | final lm loss {:.6E} | nan iterations {}",
            r.summary_first, r.summary_last, t.train_iters, r.mean_seconds, r.mean_tflops,
            tokens_per_iter / r.mean_seconds, r.loss.back(), r.nan_iterations);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const pl::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "pretrain_llama: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "pretrain_llama: internal error: %s\n", e.what());
    return 3;
  }
}
