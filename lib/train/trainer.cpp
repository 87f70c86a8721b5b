#include "train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/step_timer.h"
#include "core/timers.h"
#include "log/megatron_log.h"
#include "model/accounting.h"

namespace pl {

namespace {
// "SIGTERM", "SIGINT", ... (Megatron's line names the signal).
std::string sigabbrev(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    default: return fmt::format("signal {}", sig);
  }
}

std::unique_ptr<parallel::World> one_rank_world_unless(const DataParallelRanks& r) {
  PL_CHECK((r.world == nullptr) == (r.comm == nullptr), "internal: a trainer needs both its world and its communicator");
  return r.world ? nullptr : std::make_unique<parallel::World>(parallel::World::single());
}

// The model's ops report to `timers` (OpContext::timers) while this lives; to the previous ones after.
struct ModelTimers {
  ModelTimers(LlamaModel& m, Timers* timers) : model(m), previous(m.context().timers) { m.set_timers(timers); }
  ~ModelTimers() { model.set_timers(previous); }
  LlamaModel& model;
  Timers* const previous;
};
}  // namespace

Trainer::Trainer(LlamaModel& model, const TrainConfig& cfg, BatchFn batches, LineFn out, EvalData eval,
                 CheckpointFn checkpoint, DataParallelRanks ranks)
    : model_(model),
      cfg_(cfg),
      batches_(std::move(batches)),
      out_(std::move(out)),
      eval_(std::move(eval)),
      checkpoint_(std::move(checkpoint)),
      own_world_(one_rank_world_unless(ranks)),
      own_comm_(own_world_ ? parallel::make_communicator(*own_world_, model.context()) : nullptr),
      world_(own_world_ ? own_world_.get() : ranks.world),
      comm_(own_comm_ ? own_comm_.get() : ranks.comm),
      opt_(model, optimizer_config(cfg), world_),
      sync_(model, *comm_, cfg),
      schedule_(LrSchedule::from_iterations(cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.train_iters,
                                            cfg.global_batch_size)) {
  validate_train_config(cfg_);
  PL_CHECK(world_->size() == cfg.data_parallel_size && comm_->size() == cfg.data_parallel_size,
           "internal: data-parallel size {} but {} ranks", cfg.data_parallel_size, world_->size());
  model_.set_communicator(comm_);
  PL_CHECK(model.tokens_per_micro_batch() == cfg.micro_batch_size * cfg.seq_length,
           "internal: model built for {} tokens per micro-batch, trainer needs {}", model.tokens_per_micro_batch(),
           cfg.micro_batch_size * cfg.seq_length);
}

void Trainer::log_quant_stats(int64_t iteration) {
  for (const LinearStats& ls : model_.quant_stats())
    for (const OperandStats& o : ls.operands)
      print_last(fmt::format("quant stats | iteration {:8d} | layer {:3d} {:<11} | {:<13} | {:<8} | amax {:.6E} | saturated "
                       "{:.6f} | underflow blocks {:.6f} | rel error {:.6f}",
                       iteration, ls.layer, ls.linear, o.operand, quant_format_name(o.format), o.stats.amax,
                       o.stats.saturated_fraction, o.stats.underflow_fraction, o.stats.relative_error));
}

double Trainer::evaluate(const std::string& prefix, const BatchFn& data, int64_t first_sample) {
  const int64_t T = model_.tokens_per_micro_batch();
  const int64_t M = cfg_.num_micro_batches(), dp = cfg_.data_parallel_size, rank = world_->rank();
  std::vector<int32_t> tokens(static_cast<size_t>(T)), labels(static_cast<size_t>(T));
  const ModelTimers untimed(model_, nullptr);  // the evaluation's ops are not in the training timers
  // Megatron's evaluate sums every micro-batch's [loss sum, token count] over eval_iters batches and
  // reports sum / count.
  // The losses stay on the device and are read once per model_.loss_slots() micro-batches.
  double loss_sum = 0.0;
  const int64_t K = model_.loss_slots();
  for (int64_t e = 0; e < cfg_.eval_iters; ++e)
    for (int64_t m = 0; m < M; ++m) {
      data(first_sample + e * cfg_.global_batch_size, m * dp + rank, tokens, labels);  // the sampler's slice
      const int64_t slot = (e * M + m) % K;
      model_.queue_forward(slot, tokens.data(), labels.data());
      if (slot == K - 1 || (e == cfg_.eval_iters - 1 && m == M - 1)) loss_sum = model_.add_loss_sums(slot + 1, loss_sum);
    }
  // Megatron all-reduces the sums over the data-parallel group.
  loss_sum = world_->all_reduce_sum(loss_sum);
  const double loss = loss_sum / (static_cast<double>(T) * static_cast<double>(M * dp * cfg_.eval_iters));
  for (const std::string& line : log::validation_lines(prefix, loss)) print_last(line);
  return loss;
}

// Every rank's timer readings at the last rank (which prints them): (timer id, ms bits) pairs gathered.
std::vector<log::TimerOverRanks> Trainer::timers_over_ranks(std::span<const TimerReading> mine) const {
  std::vector<uint64_t> pairs;
  for (const TimerReading& t : mine) pairs.insert(pairs.end(), {static_cast<uint64_t>(t.id), std::bit_cast<uint64_t>(t.ms)});
  std::vector<uint64_t> counts = world_->gather(std::vector<uint64_t>{pairs.size()}, world_->size() - 1);
  const std::vector<uint64_t> all = world_->gather(pairs, world_->size() - 1);
  std::vector<log::TimerOverRanks> out;
  std::vector<int> row_of(kTimerCount, -1);
  size_t at = 0;
  for (size_t rank = 0; rank < counts.size(); ++rank)
    for (uint64_t k = 0; k < counts[rank]; k += 2, at += 2) {
      const auto id = static_cast<size_t>(all[at]);
      if (row_of[id] < 0) {
        row_of[id] = static_cast<int>(out.size());
        out.push_back({timer_name(static_cast<TimerId>(id)), {}});
      }
      out[static_cast<size_t>(row_of[id])].rank_ms.emplace_back(static_cast<int>(rank), std::bit_cast<double>(all[at + 1]));
    }
  // In TimerId order, as one rank prints them.
  std::vector<log::TimerOverRanks> ordered;
  for (size_t id = 0; id < kTimerCount; ++id)
    if (row_of[id] >= 0) ordered.push_back(std::move(out[static_cast<size_t>(row_of[id])]));
  return ordered;
}

TrainResult Trainer::run(const TrainState& start) {
  StepTimer timer(model_.context().device);
  // --timing-log-level: Megatron's timers (core/timers.h); the CUDA event pool is made here, before
  // the loop. The op dispatch layer reports each op's category to them (through the model's context).
  Timers timers(model_.context().device, cfg_.timing_log_level);
  const ModelTimers timed_ops(model_, cfg_.timing_log_level > 0 ? &timers : nullptr);
  const int64_t T = model_.tokens_per_micro_batch();
  const int64_t M = cfg_.num_micro_batches(), dp = cfg_.data_parallel_size, rank = world_->rank();
  const double iter_flops = flops_per_iteration(model_.config(), cfg_.global_batch_size, cfg_.seq_length);
  std::vector<int32_t> tokens(static_cast<size_t>(T)), labels(static_cast<size_t>(T));
  // Megatron's backward: each micro-batch's mean token loss divided by the number of micro-batches, and
  // the data-parallel gradients averaged over the ranks: one scale, 1 / (tokens of the global batch),
  // the same float on every rank count, and the reduction sums.
  const float grad_scale = static_cast<float>(1.0 / (static_cast<double>(T) * static_cast<double>(M * dp)));

  TrainResult res;
  TrainState st = start;  // all the loop's state; the validation sampler continues at
                          // st.valid_consumed_samples (Megatron's consumed_valid_samples)
  const int64_t to_run = std::max<int64_t>(0, cfg_.train_iters - st.iteration);
  res.first_iteration = st.iteration + 1;
  res.loss.reserve(to_run);
  res.grad_norm.reserve(to_run);
  res.seconds.reserve(to_run);
  res.lr_used.reserve(to_run);

  // Timings are not state: the first interval after a resume times only this process's iterations.
  double interval_seconds = 0.0;
  int64_t interval_timed = 0;
  size_t allocs_after_first = 0;
  bool memory_reported = false;
  bool exited = false;

  for (int64_t it = st.iteration; it < cfg_.train_iters; ++it) {
    timer.start();
    model_.zero_grads();
    double loss_sum = 0.0;
    const bool stats_now = cfg_.quant_stats_interval > 0 && (it + 1) % cfg_.quant_stats_interval == 0;
    timers.start(TimerId::ForwardBackward);
    for (int64_t m = 0; m < M; ++m) {
      timers.start(TimerId::ForwardCompute);
      timers.start(TimerId::BatchGenerator);
      batches_(st.consumed_samples, m * dp + rank, tokens, labels);  // the sampler's slice (see trainer.h)
      timers.stop(TimerId::BatchGenerator);
      // One counter per micro-batch over the whole run (= it*M + m for a fixed batch size), so a
      // resumed run draws the same stochastic-rounding bits as one that never stopped.
      // Telemetry of the last micro-batch of the iteration.
      // With the optimizer offloaded, the last micro-batch's backward announces the gradients that are
      // final, so their copy to the host runs under the rest of the backward.
      // With data parallelism the last backward reduces the buckets it finishes (--overlap-grad-reduce).
      const auto* listener = opt_.gradient_copy_listener() ? opt_.gradient_copy_listener() : sync_.listener();
      const StepOptions step{static_cast<uint64_t>(st.micro_batches_done + m * dp + rank), stats_now && m == M - 1,
                             m == M - 1 ? listener : nullptr};
      // The losses stay on the device; read once per iteration (per loss_slots() micro-batches).
      const int64_t slot = m % model_.loss_slots();
      model_.queue_forward_backward(slot, tokens.data(), labels.data(), grad_scale, step);
      timers.stop(TimerId::BackwardCompute);  // the model switched forward-compute to backward-compute after the loss
      if (slot == model_.loss_slots() - 1 || m == M - 1) loss_sum = model_.add_loss_sums(slot + 1, loss_sum);
    }
    timers.stop(TimerId::ForwardBackward);
    st.micro_batches_done += M * dp;
    // (Timed with more than one rank only, so one-rank logs keep their timer lines.)
    if (dp > 1) timers.start(TimerId::AllGradsSync);
    sync_.finish_gradient_reduction();
    if (dp > 1) timers.stop(TimerId::AllGradsSync);
    // Reported loss: the token-weighted mean over the global batch (the sum over the ranks).
    loss_sum = world_->all_reduce_sum(loss_sum);
    const double loss = loss_sum / (static_cast<double>(T) * static_cast<double>(M * dp));
    const double lr = schedule_.lr_at(st.scheduler_samples);
    timers.start(TimerId::Optimizer);
    AdamW::Result step{};
    const bool loss_finite = std::isfinite(loss);
    if (loss_finite) {
      step = opt_.step(lr);
    } else {
      step.grad_norm = std::nan("");
      step.skipped = true;
      opt_.drop_queued_gradient_copies();
    }
    st.consumed_samples += cfg_.global_batch_size;
    if (!step.skipped) {
      st.scheduler_samples += cfg_.global_batch_size;
      if (model_.sharded()) timers.start(TimerId::ParamsAllGather);
      sync_.gather_weights();  // the distributed optimizer's updated shards to every rank (or queued)
      if (model_.sharded()) timers.stop(TimerId::ParamsAllGather);
      // Quantized weight copies for the next step's micro-batches (with --overlap-param-gather the next
      // forward makes each layer's when its weights have arrived).
      if (!cfg_.overlap_param_gather) {
        timers.start(TimerId::OptimizerCopyMainToModelParams);
        model_.prepare_weights();
        timers.stop(TimerId::OptimizerCopyMainToModelParams);
      }
    }
    timers.stop(TimerId::Optimizer);
    const double seconds = timer.stop_seconds();

    res.loss.push_back(loss_finite ? loss : std::nan(""));
    res.grad_norm.push_back(step.grad_norm);
    res.seconds.push_back(seconds);
    res.lr_used.push_back(lr);
    interval_seconds += seconds;
    ++interval_timed;
    ++st.interval_iters;
    if (step.skipped) {
      ++st.interval_skipped;
      ++st.interval_nan;
      ++st.nan_iterations;
      ++st.consecutive_nan;
    } else {
      st.interval_loss += loss;
      ++st.interval_good;
      st.consecutive_nan = 0;
    }

    const int64_t iteration = it + 1;
    st.iteration = iteration;
    exited = cfg_.exit_interval > 0 && iteration % cfg_.exit_interval == 0 && iteration < cfg_.train_iters;
    bool last = iteration == cfg_.train_iters || exited;
    // An --exit-interval stop prints no extra line (as Megatron's training_log): the open interval's
    // sums go into the checkpoint, so a resumed run prints the straight run's next line.
    if (iteration % cfg_.log_interval == 0 || iteration == cfg_.train_iters) {
      const double per_iter = interval_seconds / static_cast<double>(interval_timed);
      const double tflops = iter_flops / per_iter / static_cast<double>(cfg_.data_parallel_size) / 1e12;
      print_last(log::step_time_line(per_iter, tflops));
      log::IterationFields f;
      f.iteration = iteration;
      f.train_iters = cfg_.train_iters;
      f.consumed_samples = st.consumed_samples;
      f.elapsed_ms = per_iter * 1000.0;
      f.learning_rate = schedule_.lr_at(st.scheduler_samples);
      f.global_batch_size = cfg_.global_batch_size;
      if (st.interval_good > 0) f.lm_loss = st.interval_loss / static_cast<double>(st.interval_good);
      f.grad_norm = step.grad_norm;
      f.skipped_iterations = st.interval_skipped;
      f.nan_iterations = st.interval_nan;
      print_last(log::iteration_line(f, log::now_timestamp()));
      if (!memory_reported) {
        if (rank == 0) out_(log::memory_line(0, iteration, memory_stats(model_.context().device)));
        memory_reported = true;
      }
      // Megatron's training_log ends with timers.log(timers_to_log, normalizer=log_interval); here
      // normalized by the iterations this interval timed (= log_interval but for a last short one).
      if (timers.level() > 0)
        for (const std::string& line : log::timer_lines(
                 std::span<const log::TimerOverRanks>(timers_over_ranks(timers.read(static_cast<double>(interval_timed)))),
                 cfg_.timing_log_option))
          print_last(line);
      if (stats_now) log_quant_stats(iteration);
      interval_seconds = st.interval_loss = 0.0;
      interval_timed = 0;
      st.interval_iters = st.interval_good = st.interval_skipped = st.interval_nan = 0;
    }
    if (validation_on() && iteration % cfg_.eval_interval == 0) {
      res.valid_loss.emplace_back(iteration, evaluate(fmt::format("iteration {}", iteration), eval_.valid,
                                                      st.valid_consumed_samples));
      st.valid_consumed_samples += cfg_.eval_iters * cfg_.global_batch_size;
    }
    if (it == start.iteration) allocs_after_first = memory_stats(model_.context().device).total_allocs;
    if (st.consecutive_nan >= cfg_.max_consecutive_nan_iterations)
      fail("stopping: {} consecutive iterations had a non-finite loss or gradient norm (last at iteration {}); "
           "lower --lr or check the data",
           st.consecutive_nan, iteration);
    // --exit-signal-handler (Megatron's DistributedSignalHandler: every rank's signal state is gathered
    // after each iteration, and a signal on any rank stops all): this iteration is the last, saved.
    if (stop_flag_ != nullptr) {
      const int sig = *stop_flag_;
      const double signalled = world_->size() > 1 ? world_->all_reduce_sum(sig != 0 ? 1.0 : 0.0) : (sig != 0 ? 1.0 : 0.0);
      if (signalled > 0.0 && !last) {
        exited = last = true;
        res.stop_signal = sig != 0 ? sig : SIGTERM;  // (another rank's signal; SIGTERM is what launchers send)
      }
    }
    // Megatron's order (training.py, train()): log line, evaluation, then the checkpoint.
    if (checkpoint_) {
      sync_.finish_weight_gather();  // (a save reads the weights)
      checkpoint_(st, last);
    }
    if (res.stop_signal != 0 && world_->rank() == 0)
      out_(fmt::format("exiting program after receiving {} at iteration {}", sigabbrev(res.stop_signal), iteration));
    if (exited) break;
  }
  sync_.finish_weight_gather();  // the model's weights complete for whoever reads them next
  res.allocations_in_loop =
      res.seconds.empty() ? 0 : memory_stats(model_.context().device).total_allocs - allocs_after_first;
  res.nan_iterations = st.nan_iterations;
  res.state = st;
  // After training, as Megatron's pretrain(): the validation split (continuing) and the test split.
  // A run stopped by --exit-interval exits before them, as Megatron's train() does.
  if (!exited && validation_on())
    res.final_valid_loss = evaluate(fmt::format("iteration {} on validation set", st.iteration), eval_.valid,
                                    st.valid_consumed_samples);
  if (!exited && cfg_.eval_iters > 0 && eval_.test)
    res.final_test_loss = evaluate(fmt::format("iteration {} on test set", st.iteration), eval_.test, 0);

  // Summary over the last 60% of the iterations this process ran (the playbook reports iterations
  // 20-50 of 50); a resumed run times only its own iterations.
  const auto ran = static_cast<int64_t>(res.seconds.size());
  if (ran == 0) return res;
  const int64_t first_idx = std::clamp<int64_t>(std::llround(0.4 * static_cast<double>(ran)) - 1, 0, ran - 1);
  res.summary_first = res.first_iteration + first_idx;
  res.summary_last = res.first_iteration + ran - 1;
  double sum = 0.0;
  for (int64_t i = first_idx; i < ran; ++i) sum += res.seconds[static_cast<size_t>(i)];
  res.mean_seconds = sum / static_cast<double>(ran - first_idx);
  res.mean_tflops = iter_flops / res.mean_seconds / static_cast<double>(cfg_.data_parallel_size) / 1e12;  // per GPU
  return res;
}

}  // namespace pl
