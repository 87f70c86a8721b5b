// pretrain_llama: pretrain a Llama-shaped decoder with Megatron-Bridge's recipe and log format.
//
//   pretrain_llama --model configs/models/llama_tiny.json --device cpu --disable-fp4 --train-iters 30
//                  --global-batch-size 8 --micro-batch-size 2 --seq-length 128
//
// This file is the run: the flags resolved on every rank, then the device, the data, the model and the
// trainer with its checkpoints. The flags are in flags.cpp, the banner in banner.cpp, the memory plan's
// checks and --dry-run in memory.cpp.
#include "pretrain_llama.h"

#include <CLI/CLI.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <optional>

#include "../app_main.h"
#include "backend/device_info.h"
#include "core/error.h"
#include "log/megatron_log.h"
#include "log/tensorboard.h"
#include "model/hf_llama.h"
#include "model/llama.h"
#include "train/checkpoint.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace pl::pretrain {
namespace {

// Every line of the run goes through one stdout logger with the bare "%v" pattern, so Megatron's
// formats come out to the character and are flushed line by line.
Logger make_output(const std::string& name) {
  auto out = spdlog::stdout_logger_mt(name);
  out->set_pattern("%v");
  out->flush_on(spdlog::level::info);
  return out;
}

// --device: cuda needs a usable device; auto takes one if present, else the CPU, and says which.
Device resolve_device(const TrainConfig& t, const Logger& out) {
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

// --load: the verified checkpoint, or none when --load names the --save directory and it holds no
// checkpoint yet. Megatron then warns and starts from random (megatron/training/checkpointing.py,
// _load_base_checkpoint); we do so only in that resume-or-start case, because a --load that points
// at the wrong directory should not silently train from scratch.
// With data parallelism rank 0 reads every byte of the checkpoint (its checksums); the others check the
// manifest, the metadata and the sizes, and read only their ranges when restoring.
std::optional<VerifiedCheckpoint> find_checkpoint(const Options& o, const ModelConfig& mc, const std::string& recipe,
                                                  const parallel::World& world, const Logger& out) {
  if (o.load.empty()) return std::nullopt;
  std::error_code ec;
  if (!o.save.empty() && std::filesystem::weakly_canonical(o.load, ec) == std::filesystem::weakly_canonical(o.save, ec) &&
      checkpoint_dir_is_empty(o.load)) {
    for (const std::string& line : log::no_checkpoint_lines(o.load, kCheckpointTracker)) out->info("{}", line);
    return std::nullopt;
  }
  VerifiedCheckpoint c = verify_checkpoint(o.load, world.rank() == 0);
  check_checkpoint_peft(c, lora_config_of(o), o.finetune);
  for (const std::string& note : compare_checkpoint_with_run(c, mc, recipe, o.train))
    out->info("pretrain_llama | checkpoint: {}", note);
  return c;
}

// The run's data (mock unless --data-path), sized for training and validation, with one summary line
// per dataset and split.
data::TrainingData build_data(const data::DataConfig& flags, const ModelConfig& mc, const TrainConfig& t,
                              const Logger& out) {
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

// The splits' micro-batches (the ids are checked where they are built: data::TrainingData::micro_batch).
Batches batches_of(const data::TrainingData& d, int64_t micro_batch) {
  const auto split = [&d, micro_batch](data::Split s) -> BatchFn {
    if (!d.has_split(s)) return {};
    return [&d, s, micro_batch](int64_t first, int64_t micro, std::span<int32_t> tok, std::span<int32_t> lab,
                                std::span<int32_t> pos) { d.micro_batch(s, first, micro, micro_batch, tok, lab, pos); };
  };
  return Batches{split(data::Split::train), split(data::Split::valid), split(data::Split::test)};
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

// What the stages of a run share once the flags are resolved (owned by run()).
struct RunInputs {
  const parallel::World& world;
  const Options& o;
  const RunSetup& setup;
  // Megatron prints the start-up lines from rank 0 (print_rank_0) and the iteration lines from the last
  // rank (print_rank_last): `out` is rank 0's; the observers choose their own rank for `lines`.
  Logger out, lines;
  std::unique_ptr<SaveDirectoryLock>& save_lock;  // rank 0's, with --save (moved to the checkpoints' observer)
  observe::TensorBoardLog* tensorboard;           // the last rank's, with --tensorboard-dir
  int argc;
  char** argv;
};

// The trainer over the built model, with the run's outputs (the checkpoints resume from --load's).
int train(const RunInputs& in, LlamaModel& model, const data::TrainingData& dataset, parallel::Communicator& comm,
          OutputInputs outputs) {
  const TrainConfig& t = in.o.train;
  const RunOutputs out = make_outputs(in.o, std::move(outputs));
  Trainer trainer(model, t, batches_of(dataset, t.micro_batch_size), out.list(), DataParallelRanks{&in.world, &comm});
  // The initial weights, once the trainer has given the model its communicator (sharded masters gather them).
  // (Under LoRA the import fills the frozen base; the adapters take their initial values first.)
  if (!in.o.init_from_hf.empty()) {
    if (model.lora()) model.init_adapters(t.seed);
    in.out->info("pretrain_llama | {}", import_hf(in.o.init_from_hf, model).describe());
  } else
    model.init_parameters(t.seed);
  print_data_parallel(in.world, comm, t, model, trainer.gradient_buckets(), in.out);
  print_stop_signals(in.o, in.out);
  trainer.run(out.checkpoints->start_state());
  return 0;
}

// The device, the memory plan and its checks, the checkpoint to resume from, the data and the model,
// then train(). The GPU's state and the communicator outlive the model and every op.
int build_and_train(const RunInputs& in) {
  const Options& o = in.o;
  const TrainConfig& t = o.train;
  const RunSetup& setup = in.setup;
  const ModelConfig& mc = setup.mc;
  const parallel::World& world = in.world;
  const Logger& out = in.out;
  const Device device = resolve_device(t, out);
  // The node's GPU of this rank (its local rank), before the device state opens a context on it.
  if (device == Device::CUDA) parallel::select_local_device(world);
  PL_CHECK(!(t.fp32_reference && device == Device::CUDA), "--fp32-reference is a CPU-only mode (use --device cpu)");
  const int threads = configure_threads(t.threads);
  OpContext ctx{.device = device, .round_bf16 = !t.fp32_reference};
  print_model_and_plan(setup, t, device, threads, out);
  const DeviceStateHandle gpu_state = device == Device::CUDA ? open_gpu(setup, t, ctx, out) : DeviceStateHandle{};
  if (o.probe_machine) return probe_machine_command(o, setup, ctx, out);
  const std::unique_ptr<parallel::Communicator> comm = parallel::make_communicator(world, ctx);
  print_training_and_parameters(mc, o, out);

  const RunLayout mopt = run_layout(o, setup);
  if (const std::string line = fp8_primary_weights_line(setup, mopt); !line.empty())
    out->info("pretrain_llama |   {}", line);
  const MemoryPlan mem = plan_memory(mc, t.micro_batch_size, t.seq_length, device, setup.plan, mopt, device_sm(ctx));
  check_memory_fits(mem, FitRequest{&mc, t.micro_batch_size, t.seq_length, &setup.plan, mopt,
                                    t.use_precision_aware_optimizer, o.fp8_param_gather},
                    t, device, device_sm(ctx));
  // The checkpoint is verified (sizes, checksums, model shape) before anything is built from it.
  std::optional<VerifiedCheckpoint> ckpt = find_checkpoint(o, mc, setup.recipe.name, world, out);
  if (ckpt) out->info("{}", log::loading_checkpoint_line(o.load, ckpt->iteration));
  // Megatron builds the dataset indices on rank 0 while the others wait, then the others load them from
  // the cache (two ranks building one cache file at once would race on its temporary).
  if (world.rank() != 0) world.barrier();
  const data::TrainingData dataset = build_data(o.data, mc, t, out);
  if (world.rank() == 0) world.barrier();
  // The machine's ceilings once the checkpoint and the data are known good (a start that fails on them writes
  // no cache), and before the arena takes the device's memory (the probe's operands are freed by then).
  auto ceilings = roofline_ceilings(o, setup, ctx, world, out);
  // --downstream-eval: its tasks read now (a bad file fails before the model is built) and its evaluation model
  // planned into the arena beside the trainer's.
  std::unique_ptr<observe::DownstreamEval> downstream = make_downstream_eval(
      o, mc, [lines = in.lines](const std::string& note) { lines->info("pretrain_llama | {}", note); });
  const double eval_bytes = downstream ? downstream->planned_bytes(device, device_sm(ctx)) : 0.0;
  if (device == Device::CUDA) reserve_device_arena(device, mem.total() + eval_bytes + kArenaSlack);

  RunLayout layout = mopt;
  layout.packing = data::document_packing(dataset, mopt.packing);  // the data's EOD id (or a one-line error)
  if (const std::string line = packing_line(layout.packing, t); !line.empty()) out->info("pretrain_llama | {}", line);
  LlamaModel model(mc, t.micro_batch_size, t.seq_length, ctx, setup.plan, layout);
  // The banner says which attention algorithm cuDNN built, and the workspace it asked for. With
  // --reset-attention-mask the document graphs of the largest bucket (T documents) are built now, so their
  // workspace and offsets scratch exist before the loop (the count alone selects them; no offsets are read).
  if (device == Device::CUDA) {
    AttentionShape shape{t.micro_batch_size, t.seq_length, mc.num_attention_heads, mc.num_query_groups, mc.kv_channels};
    if (layout.packing.reset_attention_mask)
      shape.docs = DocumentBoundaries{nullptr, nullptr, t.micro_batch_size * t.seq_length};
    out->info("pretrain_llama |   {}", prepare_attention(ctx, shape, model.memory_plan().workspace));
  }
  GemmAlgorithms algorithms = choose_gemm_algorithms(o, ckpt, model, world, out);
  RunFacts facts{setup, o, ctx, mem, dataset.summary(), std::vector<std::string>(in.argv, in.argv + in.argc)};
  return train(in, model, dataset, *comm,
               OutputInputs{world, setup, in.lines, std::move(in.save_lock), in.tensorboard, std::move(ckpt),
                            std::move(ceilings), run_facts(facts), facts.command_line, std::move(algorithms),
                            std::move(downstream)});
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
  // Data parallelism: one rank per GPU, the data-parallel size is the world's (--dry-run-world-size plans
  // another).
  o.train.data_parallel_size = o.dry_run && o.dry_run_world_size > 0 ? o.dry_run_world_size : world.size();
  o.dp_rank = o.dry_run ? 0 : world.rank();
  RunSetup setup;
  if (const int rc = agree_or_fail(world, [&] {
        validate_flags(o, app);
        setup = resolve_model_and_plan(o, app, argv[0]);
        apply_init_method_std(o, setup);
        check_outputs_apart(o, setup);
      }))
    return rc;
  auto out = make_output("pretrain_llama");
  auto lines = make_output("pretrain_llama.lines");
  if (world.rank() != 0) out->set_level(spdlog::level::off);
  if (o.dry_run) {
    print_dry_run(setup, o, out);
    return 0;
  }
  // --save is claimed now, not at the first save hours in: a directory we can write, locked against a
  // second run (rank 0 writes it; every rank learns of a failure and exits 1).
  std::unique_ptr<SaveDirectoryLock> save_lock;
  if (!o.save.empty())
    if (const int rc = agree_or_fail(world, [&] {
          if (world.rank() == 0) save_lock = std::make_unique<SaveDirectoryLock>(o.save);
        }))
      return rc;
  // --tensorboard-dir: the writer rank (Megatron's: the last) creates the directory and its events file now,
  // before the model is built, so a path it cannot write is a one-line error, not a run without its curves.
  // On an error or a signal stop its destructor still writes what was queued (a bounded wait).
  std::optional<observe::TensorBoardLog> tensorboard;
  if (!o.outputs.tensorboard.dir.empty() && !o.probe_machine)  // (--probe-machine trains nothing)
    if (const int rc = agree_or_fail(world, [&] {
          if (world.rank() != world.size() - 1) return;
          tensorboard.emplace(o.outputs.tensorboard,
                              [lines](const std::string& note) { lines->info("pretrain_llama | {}", note); });
          lines->info("pretrain_llama | tensorboard: writing {} (per-iteration scalars every {} iterations)",
                      tensorboard->path(), o.outputs.tensorboard.log_interval);
        }))
      return rc;
  return build_and_train(
      RunInputs{world, o, setup, out, lines, save_lock, tensorboard ? &*tensorboard : nullptr, argc, argv});
}

// Every rank runs `run`. An error after the ranks have started working together ends all of them: the
// failing rank prints its line (naming itself) and aborts the world (MPI_Abort, after ncclCommAbort), so no
// rank waits forever in a collective. One rank: the usual one line and exit code (app_main.h).
int run_rank(int argc, char** argv) {
  const parallel::World world(argc, argv);
  return app::on_every_rank("pretrain_llama", world, [&] { return run(world, argc, argv); });
}

}  // namespace
}  // namespace pl::pretrain

int main(int argc, char** argv) { return pl::app::guarded_main("pretrain_llama", pl::pretrain::run_rank, argc, argv); }
