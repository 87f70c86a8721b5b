#include "train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>

#include "backend/op_costs.h"
#include "backend/profiler.h"
#include "core/error.h"
#include "core/nvtx.h"
#include "core/step_timer.h"
#include "core/timers.h"
#include "data/documents.h"
#include "log/megatron_log.h"
#include "model/accounting.h"
#include "roofline/report.h"

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

// The timing summary over the last 60% of the iterations this process ran (the playbook reports
// iterations 20-50 of 50); a resumed run times only its own iterations.
void summarize(TrainResult& res, double iter_flops, int64_t data_parallel_size) {
  const auto ran = static_cast<int64_t>(res.seconds.size());
  if (ran == 0) return;
  const int64_t first_idx = std::clamp<int64_t>(std::llround(0.4 * static_cast<double>(ran)) - 1, 0, ran - 1);
  res.summary_first = res.first_iteration + first_idx;
  res.summary_last = res.first_iteration + ran - 1;
  double sum = 0.0;
  for (int64_t i = first_idx; i < ran; ++i) sum += res.seconds[static_cast<size_t>(i)];
  res.mean_seconds = sum / static_cast<double>(ran - first_idx);
  res.mean_tflops = iter_flops / res.mean_seconds / static_cast<double>(data_parallel_size) / 1e12;  // per GPU
}
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
      schedule_(LrSchedule::from_config(cfg)),
      start_time_(std::chrono::steady_clock::now()) {
  validate_train_config(cfg_);
  PL_CHECK(world_->size() == cfg.data_parallel_size && comm_->size() == cfg.data_parallel_size,
           "internal: data-parallel size {} but {} ranks", cfg.data_parallel_size, world_->size());
  model_.set_communicator(comm_);
  PL_CHECK(model.tokens_per_micro_batch() == cfg.micro_batch_size * cfg.seq_length,
           "internal: model built for {} tokens per micro-batch, trainer needs {}", model.tokens_per_micro_batch(),
           cfg.micro_batch_size * cfg.seq_length);
}

// --timing-log-level 2 with the optimizer offloaded, after Megatron's timer lines: the host AdamW's time
// per iteration and the bandwidth it reached (bytes moved / time inside the update op). With the overlap
// the host step runs beside the next forward, so the chunks of a step still running count in the next
// interval.
std::string Trainer::host_optimizer_line(int64_t iterations) {
  const AdamW::HostWork w = opt_.take_host_work();
  const double per_iter_ms = w.seconds * 1e3 / static_cast<double>(std::max<int64_t>(1, iterations));
  return fmt::format("    {:.<48}: {:.2f} ms per iteration, {:.2f} GB moved, {:.2f} GB/s{}",
                     "host-optimizer-step (AdamW on the host) ", per_iter_ms, w.bytes / 1e9,
                     w.seconds > 0.0 ? w.bytes / w.seconds / 1e9 : 0.0,
                     opt_.overlapped() ? " (overlapped with the next forward)" : "");
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
  opt_.finish_host_step();  // (the forward would wait per layer anyway; the host worker is done first)
  const int64_t T = model_.tokens_per_micro_batch();
  const int64_t M = cfg_.num_micro_batches(), dp = cfg_.data_parallel_size, rank = world_->rank();
  std::vector<int32_t> tokens(static_cast<size_t>(T)), labels(static_cast<size_t>(T));
  std::vector<int32_t> positions(model_.packing().explicit_documents ? static_cast<size_t>(T) : 0);
  const ModelTimers untimed(model_, nullptr);  // the evaluation's ops are not in the training timers
  // Megatron's evaluate sums every micro-batch's [loss sum, token count] over eval_iters batches and
  // reports sum / count.
  // The losses stay on the device and are read once per model_.loss_slots() micro-batches.
  // With masked positions (--eod-mask-loss) the count is of the positions counted (data/documents.h), as
  // Megatron's loss_func reports [Σ masked losses, Σ loss_mask]; without, every token: the same division.
  double sums[2] = {0.0, 0.0};  // loss sum, counted tokens
  double& loss_sum = sums[0];
  const int64_t K = model_.loss_slots();
  for (int64_t e = 0; e < cfg_.eval_iters; ++e)
    for (int64_t m = 0; m < M; ++m) {
      data(first_sample + e * cfg_.global_batch_size, m * dp + rank, tokens, labels, positions);  // the sampler's slice
      sums[1] += static_cast<double>(data::counted_tokens(model_.packing(), tokens, labels));
      const int64_t slot = (e * M + m) % K;
      model_.queue_forward(slot, tokens.data(), labels.data(), positions.empty() ? nullptr : positions.data());
      if (slot == K - 1 || (e == cfg_.eval_iters - 1 && m == M - 1)) loss_sum = model_.add_loss_sums(slot + 1, loss_sum);
    }
  // Megatron all-reduces the sums over the data-parallel group. No counted token at all: loss 0 (Megatron's
  // 0/0 would print NaN), the same rule as training's.
  world_->all_reduce_sum(sums);
  const double loss = loss_sum / std::max(sums[1], 1.0);
  for (const std::string& line : log::validation_lines(prefix, loss)) print_last(line);
  return loss;
}

// Every rank's timer readings at the last rank (which prints them): (timer id, ms bits) pairs gathered;
// in TimerId order, as one rank prints them.
std::vector<log::TimerOverRanks> Trainer::timers_over_ranks(std::span<const TimerReading> mine) const {
  std::vector<uint64_t> pairs;
  for (const TimerReading& t : mine) pairs.insert(pairs.end(), {static_cast<uint64_t>(t.id), std::bit_cast<uint64_t>(t.ms)});
  const std::vector<uint64_t> counts = world_->gather(std::vector<uint64_t>{pairs.size()}, world_->size() - 1);
  const std::vector<uint64_t> all = world_->gather(pairs, world_->size() - 1);
  std::vector<log::TimerOverRanks> by_id(kTimerCount);
  size_t at = 0;
  for (size_t rank = 0; rank < counts.size(); ++rank)
    for (uint64_t k = 0; k < counts[rank]; k += 2, at += 2)
      by_id[static_cast<size_t>(all[at])].rank_ms.emplace_back(static_cast<int>(rank), std::bit_cast<double>(all[at + 1]));
  std::vector<log::TimerOverRanks> out;
  for (size_t id = 0; id < kTimerCount; ++id)
    if (!by_id[id].rank_ms.empty()) out.push_back({timer_name(static_cast<TimerId>(id)), std::move(by_id[id].rank_ms)});
  return out;
}

namespace {
// A collective over `ranks` on buffer `t`, for the roofline: NCCL-tests' "bus bytes" (what each rank sends,
// and receives, over the ring: (ranks-1)/ranks of the buffer per pass, 2 passes for an all-reduce, 1 for a
// reduce-scatter or an all-gather), the reduction's adds for a reducing collective. Its row shows the time
// the step waits for it (with overlap, the rest runs under the backward or the next forward).
OpCosts collective_cost(const Tensor& t, int64_t ranks, double passes, bool reduces) {
  const double share = static_cast<double>(ranks - 1) / static_cast<double>(ranks);
  const double bytes = static_cast<double>(t.bytes());
  OpCosts c;
  c.phase[0] = OpCost{nullptr, OpKind::Comm, cost::dtype_row_name(t.dtype),
                      reduces ? share * static_cast<double>(t.numel()) : 0.0, passes * share * bytes, bytes};
  return c;
}
}  // namespace

// One run()'s loop state beside the TrainState (which a checkpoint saves): the timers, the batch
// buffers, and what this process measures. Timings are not state: the first interval after a resume
// times only this process's iterations.
struct Trainer::RunState {
  RunState(const Trainer& t, const TrainState& start);
  StepTimer step_timer;
  // --timing-log-level: Megatron's timers (core/timers.h); the CUDA event pool is made here, before
  // the loop. The op dispatch layer reports each op's category to them (through the model's context).
  Timers timers;
  const double iter_flops;
  std::vector<int32_t> tokens, labels;
  std::vector<int32_t> positions;  // explicit documents only (SFT packs), else empty
  const int32_t* positions_or_null() const { return positions.empty() ? nullptr : positions.data(); }
  TrainState st;  // the validation sampler continues at st.valid_consumed_samples (Megatron's consumed_valid_samples)
  TrainResult res;
  double interval_seconds = 0.0;
  int64_t interval_timed = 0;
  roofline::Measurement roofline;  // --roofline: the window measured so far (rows read at report time)
  size_t allocs_after_first = 0;
  bool memory_reported = false;
  bool exited = false;  // stopped before --train-iters (--exit-interval, a signal): no final evaluation
};

Trainer::RunState::RunState(const Trainer& t, const TrainState& start)
    : step_timer(t.model_.context().device),
      timers(t.model_.context().device, t.cfg_.timing_log_level, t.cfg_.roofline),
      iter_flops(flops_per_iteration(t.model_.config(), t.cfg_.global_batch_size, t.cfg_.seq_length)),
      tokens(static_cast<size_t>(t.model_.tokens_per_micro_batch())),
      labels(tokens.size()),
      positions(t.model_.packing().explicit_documents ? tokens.size() : 0),
      st(start) {
  const int64_t to_run = std::max<int64_t>(0, t.cfg_.train_iters - st.iteration);
  res.first_iteration = st.iteration + 1;
  for (std::vector<double>* v : {&res.loss, &res.grad_norm, &res.seconds, &res.lr_used}) v->reserve(to_run);
}

TrainResult Trainer::run(const TrainState& start) {
  RunState r(*this, start);
  // The ops report to the timers when anything is timed, and for --profile's NVTX ranges.
  const ModelTimers timed_ops(model_, cfg_.timing_log_level > 0 || cfg_.roofline || cfg_.profile ? &r.timers : nullptr);
  while (r.st.iteration < cfg_.train_iters) {
    const int64_t iteration = step(r);
    if (tensorboard_) tensorboard_iteration(r, iteration);
    // An --exit-interval stop prints no extra line (as Megatron's training_log): the open interval's
    // sums go into the checkpoint, so a resumed run prints the straight run's next line.
    if (iteration % cfg_.log_interval == 0 || iteration == cfg_.train_iters) log_interval(r, iteration);
    if (after_iteration(r, iteration)) break;
  }
  sync_.finish_weight_gather();  // the model's weights complete for whoever reads them next
  opt_.finish_host_step();       // and the masters and moments (the optimizer offload's overlap)
  report_roofline(r, true);
  TrainResult& res = r.res;
  res.allocations_in_loop =
      res.seconds.empty() ? 0 : memory_stats(model_.context().device).total_allocs - r.allocs_after_first;
  res.nan_iterations = r.st.nan_iterations;
  res.state = r.st;
  // After training, as Megatron's pretrain(): the validation split (continuing) and the test split.
  // A run stopped by --exit-interval exits before them, as Megatron's train() does.
  if (!r.exited && validation_on()) {
    res.final_valid_loss = evaluate(fmt::format("iteration {} on validation set", r.st.iteration), eval_.valid,
                                    r.st.valid_consumed_samples);
    if (tensorboard_) tensorboard_->evaluation(r.st.iteration, r.st.consumed_samples, res.final_valid_loss, false);
  }
  if (!r.exited && cfg_.eval_iters > 0 && eval_.test) {
    res.final_test_loss = evaluate(fmt::format("iteration {} on test set", r.st.iteration), eval_.test, 0);
    if (tensorboard_) tensorboard_->evaluation(r.st.iteration, r.st.consumed_samples, res.final_test_loss, true);
  }
  summarize(res, r.iter_flops, cfg_.data_parallel_size);
  return std::move(res);
}

// One iteration: the micro-batches' forward and backward, the optimizer step (skipped when the loss or
// the gradient norm is not finite), and the loop state's counters. Returns the iteration's number.
int64_t Trainer::step(RunState& r) {
  TrainState& st = r.st;
  const bool measured = measured_by_roofline(r, st.iteration + 1);
  if (measured) r.timers.set_op_rows_active(true);
  profile_window(st.iteration, true);
  const nvtx::Range step_range("iteration");
  r.step_timer.start();
  const double loss = forward_backward(r);
  const double lr = schedule_.lr_at(st.scheduler_samples);
  const AdamW::Result opt = optimizer_step(r, loss, lr);
  const double seconds = r.step_timer.stop_seconds();
  if (measured) {
    r.timers.set_op_rows_active(false);
    roofline::Measurement& m = r.roofline;
    if (m.iterations++ == 0) m.first_iteration = st.iteration + 1;
    m.last_iteration = st.iteration + 1;
    m.step_ms_sum += seconds * 1e3;
  }
  profile_window(st.iteration + 1, false);

  r.res.loss.push_back(std::isfinite(loss) ? loss : std::nan(""));
  r.res.grad_norm.push_back(opt.grad_norm);
  r.res.seconds.push_back(seconds);
  r.res.lr_used.push_back(lr);
  r.interval_seconds += seconds;
  ++r.interval_timed;
  ++st.interval_iters;
  if (opt.skipped) {
    ++st.interval_skipped;
    ++st.interval_nan;
    ++st.nan_iterations;
    ++st.consecutive_nan;
  } else {
    st.interval_loss += loss;
    ++st.interval_good;
    st.consecutive_nan = 0;
  }
  return ++st.iteration;
}

// Every micro-batch of the iteration, forward and backward, then the gradients' reduction over the
// ranks. Returns the reported loss: the token-weighted mean over the global batch.
double Trainer::forward_backward(RunState& r) {
  const int64_t M = cfg_.num_micro_batches(), dp = cfg_.data_parallel_size, rank = world_->rank();
  // --calculate-per-token-loss: the global batch's counted tokens, known before any backward.
  const double global_tokens = cfg_.calculate_per_token_loss ? global_batch_tokens(r) : 0.0;
  const bool stats_now = quant_stats_at(r.st.iteration + 1);
  Timers& timers = r.timers;
  // BF16 main grads: the first micro-batch's backward overwrites them (StepOptions::overwrite_main_grads),
  // so no pass zeroes them (16 GB at 8B). FP32 main grads are accumulated into by the GEMMs' beta, the
  // norms' and the embedding's backward: zeroed here.
  const bool overwrite = cfg_.main_grads_dtype == "bf16";
  if (!overwrite) model_.zero_grads();
  double sums[2] = {0.0, 0.0};  // the loss sum and the tokens counted in it, over this rank's micro-batches
  double& loss_sum = sums[0];
  timers.start(TimerId::ForwardBackward);
  for (int64_t m = 0; m < M; ++m) {
    timers.start(TimerId::ForwardCompute);
    timers.start(TimerId::BatchGenerator);
    batches_(r.st.consumed_samples, m * dp + rank, r.tokens, r.labels, r.positions);  // the sampler's slice (trainer.h)
    timers.stop(TimerId::BatchGenerator);
    const int64_t counted = data::counted_tokens(model_.packing(), r.tokens, r.labels);
    sums[1] += static_cast<double>(counted);
    const float grad_scale = loss_gradient_scale(counted, global_tokens);
    // One counter per micro-batch over the whole run (= it*M + m for a fixed batch size), so a
    // resumed run draws the same stochastic-rounding bits as one that never stopped.
    // Telemetry of the last micro-batch of the iteration.
    // With the optimizer offloaded, the last micro-batch's backward announces the gradients that are
    // final, so their copy to the host runs under the rest of the backward.
    // With data parallelism the last backward reduces the buckets it finishes (--overlap-grad-reduce).
    const auto* listener = opt_.gradient_copy_listener() ? opt_.gradient_copy_listener() : sync_.listener();
    const StepOptions step{static_cast<uint64_t>(r.st.micro_batches_done + m * dp + rank), stats_now && m == M - 1,
                           m == M - 1 ? listener : nullptr, overwrite && m == 0};
    // The losses stay on the device; read once per iteration (per loss_slots() micro-batches).
    const int64_t slot = m % model_.loss_slots();
    model_.queue_forward_backward(slot, r.tokens.data(), r.labels.data(), grad_scale, step, r.positions_or_null());
    timers.stop(TimerId::BackwardCompute);  // the model switched forward-compute to backward-compute after the loss
    if (slot == model_.loss_slots() - 1 || m == M - 1) loss_sum = model_.add_loss_sums(slot + 1, loss_sum);
  }
  timers.stop(TimerId::ForwardBackward);
  r.st.micro_batches_done += M * dp;
  // (Timed with more than one rank only, so one-rank logs keep their timer lines.)
  {
    const OpTimer reduction(dp > 1 ? &timers : nullptr, TimerId::AllGradsSync);
    if (reduction.measuring_rows())
      reduction.attach(model_.sharded() ? "reduce_scatter" : "all_reduce", {},
                       collective_cost(model_.grads_padded(), dp, model_.sharded() ? 1.0 : 2.0, true));
    sync_.finish_gradient_reduction();
  }
  // The reported loss, as Megatron's training_step reports 'lm loss' with or without
  // --calculate-per-token-loss: [Σ loss, Σ counted tokens] summed over the micro-batches and the ranks, then
  // divided. No counted token at all (every position masked): 0, where Megatron's report would be 0/0 = NaN;
  // here a NaN loss would skip the step, and the gradients (all zero) are finite.
  world_->all_reduce_sum(sums);
  return loss_sum / std::max(sums[1], 1.0);
}

// The scale of one micro-batch's gradient of its loss SUM (the cross-entropy's grad_scale), following
// Megatron-LM (megatron/core/pipeline_parallel/schedules.py forward_step_calc_loss, finalize_model_grads.py):
//   default: the micro-batch's mean over its counted tokens, divided by the number of micro-batches, and
//            averaged over the data-parallel ranks: 1 / (max(counted, 1) · M · dp) (Megatron clamps the count
//            to 1, so an all-masked micro-batch adds nothing); without masking counted = T, today's 1 / (T·M·dp)
//            to the bit;
//   --calculate-per-token-loss: the loss sums of the whole global batch divided by the tokens counted over it
//            (all ranks; Megatron scales the reduced gradients by 1 / max(num_tokens, 1)): 1 / max(N, 1).
float Trainer::loss_gradient_scale(int64_t counted, double global_tokens) const {
  const double M = static_cast<double>(cfg_.num_micro_batches()), dp = static_cast<double>(cfg_.data_parallel_size);
  if (cfg_.calculate_per_token_loss) return static_cast<float>(1.0 / std::max(global_tokens, 1.0));
  return static_cast<float>(1.0 / (static_cast<double>(std::max<int64_t>(counted, 1)) * (M * dp)));
}

// --calculate-per-token-loss: the tokens counted in the loss over the global batch (every micro-batch of this
// rank read once more, then summed over the ranks), before the first backward needs the scale.
double Trainer::global_batch_tokens(RunState& r) {
  const int64_t M = cfg_.num_micro_batches(), dp = cfg_.data_parallel_size, rank = world_->rank();
  double counted = 0.0;
  for (int64_t m = 0; m < M; ++m) {
    batches_(r.st.consumed_samples, m * dp + rank, r.tokens, r.labels, r.positions);
    counted += static_cast<double>(data::counted_tokens(model_.packing(), r.tokens, r.labels));
  }
  return world_->all_reduce_sum(counted);
}

// Megatron's "optimizer" timer: AdamW, or the skip of a non-finite loss; after a step the updated weights
// to every rank and their quantized copies.
AdamW::Result Trainer::optimizer_step(RunState& r, double loss, double lr) {
  Timers& timers = r.timers;
  timers.start(TimerId::Optimizer);
  AdamW::Result step{};
  if (std::isfinite(loss)) {
    step = opt_.step(lr, schedule_.wd_at(r.st.scheduler_samples));
  } else {
    step.grad_norm = std::nan("");
    step.skipped = true;
    opt_.drop_queued_gradient_copies();
  }
  r.st.consumed_samples += cfg_.global_batch_size;
  if (!step.skipped) {
    r.st.scheduler_samples += cfg_.global_batch_size;
    {
      const OpTimer gather(model_.sharded() ? &timers : nullptr, TimerId::ParamsAllGather);
      if (gather.measuring_rows())
        gather.attach("all_gather", {}, collective_cost(model_.weights_padded(), cfg_.data_parallel_size, 1.0, false));
      sync_.gather_weights();  // the distributed optimizer's updated shards to every rank (or queued)
    }
    // Quantized weight copies for the next step's micro-batches (with --overlap-param-gather the next
    // forward makes each layer's when its weights have arrived).
    // (Likewise with --overlap-cpu-optimizer-d2h-h2d, whose host step is still running.)
    if (!cfg_.overlap_param_gather && !opt_.overlapped()) {
      timers.start(TimerId::OptimizerCopyMainToModelParams);
      model_.prepare_weights();
      timers.stop(TimerId::OptimizerCopyMainToModelParams);
    }
  }
  timers.stop(TimerId::Optimizer);
  return step;
}

// Megatron's training_log at the end of a log interval: the Step Time and iteration lines, the memory
// line (once), the timers, the quantization telemetry; then the interval's sums start again.
void Trainer::log_interval(RunState& r, int64_t iteration) {
  TrainState& st = r.st;
  const double per_iter = r.interval_seconds / static_cast<double>(r.interval_timed);
  const double tflops = r.iter_flops / per_iter / static_cast<double>(cfg_.data_parallel_size) / 1e12;
  print_last(log::step_time_line(per_iter, tflops));
  log::IterationFields f;
  f.iteration = iteration;
  f.train_iters = cfg_.train_iters;
  f.consumed_samples = st.consumed_samples;
  f.elapsed_ms = per_iter * 1000.0;
  f.learning_rate = schedule_.lr_at(st.scheduler_samples);
  f.global_batch_size = cfg_.global_batch_size;
  if (st.interval_good > 0) f.lm_loss = st.interval_loss / static_cast<double>(st.interval_good);
  f.grad_norm = r.res.grad_norm.back();  // the last iteration's
  if (cfg_.log_params_norm) f.params_norm = opt_.master_weights_norm();  // (after the interval's last step)
  f.skipped_iterations = st.interval_skipped;
  f.nan_iterations = st.interval_nan;
  print_last(log::iteration_line(f, log::now_timestamp()));
  if (!r.memory_reported) {
    if (world_->rank() == 0) out_(log::memory_line(0, iteration, memory_stats(model_.context().device)));
    r.memory_reported = true;
  }
  // Megatron's training_log ends with timers.log(timers_to_log, normalizer=log_interval); here
  // normalized by the iterations this interval timed (= log_interval but for a last short one).
  std::vector<log::TimerOverRanks> timers;
  if (r.timers.level() > 0) {
    timers = timers_over_ranks(r.timers.read(static_cast<double>(r.interval_timed)));
    for (const std::string& line :
         log::timer_lines(std::span<const log::TimerOverRanks>(timers), cfg_.timing_log_option))
      print_last(line);
  }
  if (r.timers.level() >= 2 && cfg_.optimizer_cpu_offload) print_last(host_optimizer_line(r.interval_timed));
  if (quant_stats_at(iteration)) log_quant_stats(iteration);
  // (The last iteration's table is the final one, printed once when the run ends.)
  if (cfg_.roofline_at_log_interval && iteration != cfg_.train_iters) report_roofline(r, false);
  if (tensorboard_)
    tensorboard_->interval({iteration, per_iter, tflops,
                            static_cast<double>(cfg_.global_batch_size * cfg_.seq_length) / per_iter, timers});
  r.interval_seconds = st.interval_loss = 0.0;
  r.interval_timed = 0;
  st.interval_iters = st.interval_good = st.interval_skipped = st.interval_nan = 0;
}

// Megatron's training_log writes these every --tensorboard-log-interval (the writer applies it): the
// iteration's loss, the rate the next step uses and the step's gradient norm, as the iteration line prints
// them at --log-interval 1.
void Trainer::tensorboard_iteration(const RunState& r, int64_t iteration) const {
  log::IterationScalars s;
  s.iteration = iteration;
  s.consumed_samples = r.st.consumed_samples;
  s.batch_size = cfg_.global_batch_size;
  s.world_size = world_->size();
  s.lm_loss = r.res.loss.back();
  s.learning_rate = schedule_.lr_at(r.st.scheduler_samples);
  s.grad_norm = r.res.grad_norm.back();
  s.memory = memory_stats(model_.context().device);
  tensorboard_->iteration(s);
}

// --roofline's window (trainer.h set_roofline_listener). Megatron's --profile window: profiling starts
// before the iteration whose 0-based index is --profile-step-start and stops after 1-based iteration
// --profile-step-end (train_config.h), i.e. iterations profile_step_start + 1 .. profile_step_end.
bool Trainer::measured_by_roofline(const RunState& r, int64_t iteration) const {
  if (!cfg_.roofline) return false;
  if (cfg_.profile) return iteration > cfg_.profile_step_start && iteration <= cfg_.profile_step_end;
  const bool runs_one = cfg_.train_iters - r.res.first_iteration + 1 <= 1;
  return runs_one || iteration > r.res.first_iteration;
}

// Megatron's --profile on the listed ranks: the CUDA profiler and the NVTX ranges start before the step
// when `completed` (the iterations done) equals --profile-step-start, and stop after the step that makes
// it --profile-step-end (train_config.h).
void Trainer::profile_window(int64_t completed, bool before_step) const {
  if (!cfg_.profile || std::find(cfg_.profile_ranks.begin(), cfg_.profile_ranks.end(), world_->rank()) ==
                           cfg_.profile_ranks.end())
    return;
  const Device device = model_.context().device;
  if (before_step && completed == cfg_.profile_step_start) {
    profiler_start(device);
    nvtx::set_enabled(true);
  } else if (!before_step && completed == cfg_.profile_step_end) {
    nvtx::set_enabled(false);
    profiler_stop(device);
  }
}

void Trainer::report_roofline(RunState& r, bool final) {
  if (!cfg_.roofline || !roofline_) return;
  r.roofline.rows = r.timers.op_rows();
  roofline_(r.roofline, final);
}

// What follows an iteration's log line, in Megatron's order (training.py, train()): the evaluation, the
// NaN stop and the signal check, then the checkpoint. True when the run stops early after it.
bool Trainer::after_iteration(RunState& r, int64_t iteration) {
  if (validation_on() && iteration % cfg_.eval_interval == 0) {
    r.res.valid_loss.emplace_back(iteration, evaluate(fmt::format("iteration {}", iteration), eval_.valid,
                                                      r.st.valid_consumed_samples));
    r.st.valid_consumed_samples += cfg_.eval_iters * cfg_.global_batch_size;
    if (tensorboard_) tensorboard_->evaluation(iteration, r.st.consumed_samples, r.res.valid_loss.back().second, false);
  }
  if (iteration == r.res.first_iteration) r.allocs_after_first = memory_stats(model_.context().device).total_allocs;
  if (r.st.consecutive_nan >= cfg_.max_consecutive_nan_iterations)
    fail("stopping: {} consecutive iterations had a non-finite loss or gradient norm (last at iteration {}); "
         "lower --lr or check the data",
         r.st.consecutive_nan, iteration);
  r.exited = cfg_.exit_interval > 0 && iteration % cfg_.exit_interval == 0 && iteration < cfg_.train_iters;
  bool last = iteration == cfg_.train_iters || r.exited;
  // A signal makes this iteration the last, saved.
  if (const int sig = signal_seen(); sig != 0 && !last) {
    r.exited = last = true;
    r.res.stop_signal = sig;
  }
  const double minutes = exit_duration_minutes();
  const bool out_of_time = !last && minutes > 0.0;
  if (out_of_time) r.exited = last = true;
  // (A save finishes the weight gather and the host step through optimizer(): an iteration that saves
  // nothing leaves them running into the next forward.)
  if (checkpoint_) checkpoint_(r.st, last);
  if (r.res.stop_signal != 0 && world_->rank() == 0)
    out_(fmt::format("exiting program after receiving {} at iteration {}", sigabbrev(r.res.stop_signal), iteration));
  else if (out_of_time && world_->rank() == 0)  // Megatron's print_datetime line
    out_(fmt::format("[exiting program after {} minutes] datetime: {} ", minutes, log::now_timestamp()));
  return r.exited;
}

// --exit-duration-in-mins (Megatron's training.py after every iteration: the minutes since the program
// started, the ranks' decisions combined with a MAX all-reduce, then save and exit): this rank's elapsed
// minutes when any rank is past the budget, else 0.
double Trainer::exit_duration_minutes() const {
  if (!(cfg_.exit_duration_in_mins > 0.0)) return 0.0;
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count() / 60.0;
  const double over = minutes > cfg_.exit_duration_in_mins ? 1.0 : 0.0;
  return (world_->size() > 1 ? world_->all_reduce_sum(over) : over) > 0.0 ? minutes : 0.0;
}

// --exit-signal-handler (Megatron's DistributedSignalHandler: every rank's signal state is gathered
// after each iteration, and a signal on any rank stops all): the signal received, or 0.
int Trainer::signal_seen() const {
  if (stop_flag_ == nullptr) return 0;
  const int sig = *stop_flag_;
  const double signalled = world_->size() > 1 ? world_->all_reduce_sum(sig != 0 ? 1.0 : 0.0) : (sig != 0 ? 1.0 : 0.0);
  if (!(signalled > 0.0)) return 0;
  return sig != 0 ? sig : SIGTERM;  // (another rank's signal; SIGTERM is what launchers send)
}

}  // namespace pl
