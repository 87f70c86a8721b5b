#include "train/trainer.h"

#include <algorithm>
#include <cmath>

#include "backend/op_costs.h"
#include "core/error.h"
#include "core/nvtx.h"
#include "core/step_timer.h"
#include "core/timers.h"
#include "data/documents.h"
#include "model/accounting.h"
#include "train/evaluation.h"
#include "train/rank_timers.h"
#include "train/run_tally.h"

namespace pl {

namespace {

std::unique_ptr<parallel::World> one_rank_world_unless(const DataParallelRanks& r) {
  PL_CHECK((r.world == nullptr) == (r.comm == nullptr), "internal: a trainer needs both its world and its communicator");
  return r.world ? nullptr : std::make_unique<parallel::World>(parallel::World::single());
}

Instruments combined(const std::vector<TrainObserver*>& observers) {
  Instruments all;
  for (const TrainObserver* o : observers) {
    PL_CHECK(o != nullptr, "internal: a trainer's observer is null");
    all.op_rows = all.op_rows || o->instruments().op_rows;
    all.ops_timed = all.ops_timed || o->instruments().ops_timed;
  }
  return all;
}

// A collective the step waits for, timed as Megatron's timer `id` and, while op rows are measured, as a
// communication row (backend/op_costs.h cost::collective).
template <class Run>
void timed_collective(Timers* timers, TimerId id, const char* op, const Tensor& t, int64_t ranks, double passes,
                      bool reduces, Run&& run) {
  const OpTimer timer(timers, id);
  if (timer.measuring_rows()) timer.attach(op, {}, cost::collective(t, ranks, passes, reduces));
  run();
}

}  // namespace

Trainer::Trainer(LlamaModel& model, const TrainConfig& cfg, Batches batches, std::vector<TrainObserver*> observers,
                 DataParallelRanks ranks)
    : model_(model),
      cfg_(cfg),
      batches_(std::move(batches)),
      observers_(std::move(observers)),
      instruments_(combined(observers_)),
      own_world_(one_rank_world_unless(ranks)),
      own_comm_(own_world_ ? parallel::make_communicator(*own_world_, model.context()) : nullptr),
      world_(own_world_ ? own_world_.get() : ranks.world),
      comm_(own_comm_ ? own_comm_.get() : ranks.comm),
      opt_(model, optimizer_config(cfg), world_),
      sync_(model, *comm_, cfg),
      schedule_(LrSchedule::from_config(cfg)) {
  validate_train_config(cfg_);
  PL_CHECK(world_->size() == cfg.data_parallel_size && comm_->size() == cfg.data_parallel_size,
           "internal: data-parallel size {} but {} ranks", cfg.data_parallel_size, world_->size());
  model_.set_communicator(comm_);
  PL_CHECK(model.tokens_per_micro_batch() == cfg.micro_batch_size * cfg.seq_length,
           "internal: model built for {} tokens per micro-batch, trainer needs {}", model.tokens_per_micro_batch(),
           cfg.micro_batch_size * cfg.seq_length);
}

AdamW& Trainer::settled_optimizer() {
  sync_.finish_weight_gather();
  opt_.finish_host_step();
  return opt_;
}

// One run()'s state: its timers, the batch buffers, and its tally (run_tally.h: the loop state a checkpoint
// saves, the step times, the open interval).
struct Trainer::RunState {
  RunState(const Trainer& t, const TrainState& start)
      : step_timer(t.model_.context().device),
        timers(t.model_.context().device, t.cfg_.timing_log_level, t.instruments_.op_rows),
        tokens(static_cast<size_t>(t.model_.tokens_per_micro_batch())),
        labels(tokens.size()),
        positions(t.model_.packing().explicit_documents ? tokens.size() : 0),
        tally(t.cfg_, start,
              t.model_.lora() ? lora_flops_per_iteration(t.model_.config(), t.model_.lora_config(),
                                                          t.cfg_.global_batch_size, t.cfg_.seq_length)
                              : flops_per_iteration(t.model_.config(), t.cfg_.global_batch_size, t.cfg_.seq_length),
              t.world_->size()),
        st(tally.state()) {}
  // --timing-log-level and the observers' instruments: the CUDA event pool is made here, before the loop.
  StepTimer step_timer;
  Timers timers;
  std::vector<int32_t> tokens, labels;
  std::vector<int32_t> positions;  // explicit documents only (SFT packs), else empty
  const int32_t* positions_or_null() const { return positions.empty() ? nullptr : positions.data(); }
  RunTally tally;
  TrainState& st;  // tally's; the validation sampler continues at st.valid_consumed_samples
  size_t allocs_after_first = 0;
  log::StopRequest stop;
};

log::RunEnd Trainer::run(const TrainState& start) {
  RunState r(*this, start);
  // (A restore's ops, before the ops report to the run's timers.)
  const RunStart started{cfg_, *world_, model_, r.timers, r.tally.first_iteration()};
  notify([&](TrainObserver& o) { o.on_start(started, *this); });
  // The ops report to the timers when anything is timed (Megatron's timers, op rows, NVTX ranges).
  const bool ops_timed = cfg_.timing_log_level > 0 || instruments_.op_rows || instruments_.ops_timed;
  const ScopedTimers timed_ops(model_, ops_timed ? &r.timers : nullptr);
  while (r.st.iteration < cfg_.train_iters) {
    const log::IterationRecord it = step(r);
    notify([&](TrainObserver& o) { o.on_iteration(it); });
    // A stop before the end of an interval prints no extra interval (as Megatron's training_log): the open
    // interval's sums go into the checkpoint, so a resumed run prints the straight run's next line.
    if (it.iteration % cfg_.log_interval == 0 || it.iteration == cfg_.train_iters) {
      const log::IntervalRecord interval = interval_record(r, it);
      notify([&](TrainObserver& o) { o.on_interval(interval); });
    }
    // Megatron's order after the log line (training.py, train()): the evaluation, the stop checks, the save.
    if (validation_on() && it.iteration % cfg_.eval_interval == 0) {
      const log::EvalRecord e{it.iteration, r.st.consumed_samples, false, false,
                              evaluate(batches_.valid, r.st.valid_consumed_samples)};
      r.st.valid_consumed_samples += cfg_.eval_iters * cfg_.global_batch_size;
      notify([&](TrainObserver& o) { o.on_eval(e); });
    }
    if (it.iteration == r.tally.first_iteration()) r.allocs_after_first = memory_stats(model_.context().device).total_allocs;
    r.stop = stop_requested(it);
    const IterationEnd end{r.st, it.iteration == cfg_.train_iters || static_cast<bool>(r.stop), r.stop};
    notify([&](TrainObserver& o) { o.on_iteration_end(end, *this); });
    if (r.stop) break;
  }
  (void)settled_optimizer();  // the weights, masters and moments complete for whoever reads them next
  state_ = r.st;
  const MemoryStats memory = memory_stats(model_.context().device);
  log::RunEnd end = r.tally.end(r.stop, memory, r.tally.ran_any() ? memory.total_allocs - r.allocs_after_first : 0);
  if (!r.stop) evaluate_after_training(r, end);
  end.memory = memory_stats(model_.context().device);
  notify([&](TrainObserver& o) { o.on_end(end); });
  return end;
}

// One iteration: the micro-batches' forward and backward, the optimizer step (skipped when the loss or
// the gradient norm is not finite), counted in the tally.
log::IterationRecord Trainer::step(RunState& r) {
  IterationRequests requests;
  notify([&](TrainObserver& o) { o.before_iteration(r.st.iteration + 1, requests); });
  StepOutcome s;
  {
    const nvtx::Range step_range("iteration");
    r.step_timer.start();
    s.loss = forward_backward(r, requests.quant_stats, s.loss_tokens);
    s.lr_used = schedule_.lr_at(r.st.scheduler_samples);
    const AdamW::Result opt = optimizer_step(r, s.loss, s.lr_used);
    s.seconds = r.step_timer.stop_seconds();
    s.grad_norm = opt.grad_norm;
    s.skipped = opt.skipped;
  }
  s.lr_next = schedule_.lr_at(r.st.scheduler_samples);
  return r.tally.count_step(s, memory_stats(model_.context().device));
}

// Every micro-batch of the iteration, forward and backward, then the gradients' reduction over the
// ranks. Returns the reported loss: the token-weighted mean over the global batch.
double Trainer::forward_backward(RunState& r, bool quant_stats, double& loss_tokens) {
  const int64_t M = cfg_.num_micro_batches(), dp = cfg_.data_parallel_size, rank = world_->rank();
  // --calculate-per-token-loss: the global batch's counted tokens, known before any backward.
  const double global_tokens = cfg_.calculate_per_token_loss ? global_batch_tokens(r) : 0.0;
  Timers& timers = r.timers;
  // BF16 main grads: the first micro-batch's backward overwrites them (MicroBatchOptions::overwrite_main_grads),
  // so no pass zeroes them (16 GB at 8B). FP32 main grads are accumulated into by the GEMMs' beta, the
  // norms' and the embedding's backward: zeroed here.
  const bool overwrite = cfg_.main_grads_dtype == "bf16";
  if (!overwrite) model_.zero_grads();
  double sums[2] = {0.0, 0.0};  // the loss sum and the tokens counted in it, over this rank's micro-batches
  double& loss_sum = sums[0];
  timers.start(TimerId::ForwardBackward);
  for (int64_t m = 0; m < M; ++m) {
    timers.start(TimerId::ForwardCompute);  // Megatron's forward_step: the batch, the forward and the loss
    timers.start(TimerId::BatchGenerator);
    batches_.train(r.st.consumed_samples, m * dp + rank, r.tokens, r.labels, r.positions);  // the sampler's slice
    timers.stop(TimerId::BatchGenerator);
    const int64_t counted = data::counted_tokens(model_.packing(), r.tokens, r.labels);
    sums[1] += static_cast<double>(counted);
    // The losses stay on the device; read once per iteration (per loss_slots() micro-batches).
    const int64_t slot = m % model_.loss_slots();
    // One stochastic-rounding (and LoRA dropout) counter per micro-batch over the whole run (= it*M + m for a
    // fixed batch size), so a resumed run draws the same bits as one that never stopped.
    const auto counter = static_cast<uint64_t>(r.st.micro_batches_done + m * dp + rank);
    model_.queue_training_forward(slot, r.tokens.data(), r.labels.data(), loss_gradient_scale(counted, global_tokens),
                                  r.positions_or_null(), counter);
    timers.stop(TimerId::ForwardCompute);
    // The last micro-batch's backward collects the telemetry asked for, and announces the gradients that are
    // final: the optimizer offload copies them to the host, data parallelism reduces their buckets
    // (--overlap-grad-reduce), under the rest of the backward.
    const auto* listener = opt_.gradient_copy_listener() ? opt_.gradient_copy_listener() : sync_.listener();
    const MicroBatchOptions options{counter, quant_stats && m == M - 1, m == M - 1 ? listener : nullptr,
                                    overwrite && m == 0};
    timers.start(TimerId::BackwardCompute);
    model_.queue_backward(options);
    timers.stop(TimerId::BackwardCompute);
    if (slot == model_.loss_slots() - 1 || m == M - 1) loss_sum = model_.add_loss_sums(slot + 1, loss_sum);
  }
  timers.stop(TimerId::ForwardBackward);
  r.st.micro_batches_done += M * dp;
  // (Timed with more than one rank only, so one-rank logs keep their timer lines.)
  timed_collective(dp > 1 ? &timers : nullptr, TimerId::AllGradsSync,
                   model_.sharded() ? "reduce_scatter" : "all_reduce", model_.grads_padded(), dp,
                   model_.sharded() ? 1.0 : 2.0, true, [&] { sync_.finish_gradient_reduction(); });
  // The reported loss, as Megatron's training_step reports 'lm loss' with or without
  // --calculate-per-token-loss: [Σ loss, Σ counted tokens] summed over the micro-batches and the ranks, then
  // divided. No counted token at all (every position masked): 0, where Megatron's report would be 0/0 = NaN;
  // here a NaN loss would skip the step, and the gradients (all zero) are finite.
  world_->all_reduce_sum(sums);
  loss_tokens = sums[1];
  return loss_sum / std::max(sums[1], 1.0);
}

// The scale of one micro-batch's gradient of its loss SUM (the cross-entropy's grad_scale), following
// Megatron-LM (megatron/core/pipeline_parallel/schedules.py forward_step_calc_loss, finalize_model_grads.py):
//   default: the micro-batch's mean over its counted tokens, divided by the number of micro-batches, and
//            averaged over the data-parallel ranks: 1 / (max(counted, 1) · M · dp) (Megatron clamps the count
//            to 1, so an all-masked micro-batch adds nothing); without masking counted = T, 1 / (T·M·dp);
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
    batches_.train(r.st.consumed_samples, m * dp + rank, r.tokens, r.labels, r.positions);
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
    // The distributed optimizer's updated shards to every rank (or queued).
    timed_collective(model_.sharded() ? &timers : nullptr, TimerId::ParamsAllGather, "all_gather",
                     model_.weights_padded(), cfg_.data_parallel_size, 1.0, false, [&] { sync_.gather_weights(); });
    // Quantized weight copies for the next step's micro-batches (with --overlap-param-gather the next
    // forward makes each layer's when its weights have arrived; likewise with --overlap-cpu-optimizer-d2h-h2d,
    // whose host step is still running).
    if (!cfg_.overlap_param_gather && !opt_.overlapped()) {
      timers.start(TimerId::OptimizerCopyMainToModelParams);
      model_.prepare_weights();
      timers.stop(TimerId::OptimizerCopyMainToModelParams);
    }
  }
  timers.stop(TimerId::Optimizer);
  return step;
}

// Megatron's training_log at the end of a log interval: the tally's means and counts, the master weights' norm
// (--log-params-norm), the timers (normalized by the iterations this interval timed, = log_interval but for a
// last short one; gathered at the last rank), the host optimizer's work.
log::IntervalRecord Trainer::interval_record(RunState& r, const log::IterationRecord& it) {
  const std::optional<double> params_norm =
      cfg_.log_params_norm ? std::optional<double>(opt_.master_weights_norm()) : std::nullopt;  // (after the last step)
  log::IntervalRecord in = r.tally.close_interval(it, memory_stats(model_.context().device));
  in.params_norm = params_norm;
  if (r.timers.level() > 0) in.timers = gather_timers(*world_, r.timers.read(static_cast<double>(in.iterations)));
  if (r.timers.level() >= 2 && cfg_.optimizer_cpu_offload) {
    const AdamW::HostWork w = opt_.take_host_work();
    in.host_optimizer = log::HostOptimizerReading{w.seconds, w.bytes, opt_.overlapped()};
  }
  return in;
}

// (The forward would wait for the host step per layer anyway; the host worker is done first.)
double Trainer::evaluate(const BatchFn& data, int64_t first_sample) {
  opt_.finish_host_step();
  return evaluation_loss(model_, cfg_, *world_, data, first_sample);
}

// After training, as Megatron's pretrain(): the validation split (continuing) and the test split.
void Trainer::evaluate_after_training(RunState& r, log::RunEnd& end) {
  const auto report = [&](const BatchFn& data, int64_t first_sample, bool test, std::optional<double>& loss) {
    loss = evaluate(data, first_sample);
    const log::EvalRecord e{r.st.iteration, r.st.consumed_samples, test, true, *loss};
    notify([&](TrainObserver& o) { o.on_eval(e); });
  };
  if (validation_on()) report(batches_.valid, r.st.valid_consumed_samples, false, end.valid_loss);
  if (cfg_.eval_iters > 0 && batches_.test) report(batches_.test, 0, true, end.test_loss);
}

// Every observer is asked, every iteration, on every rank (one that combines its answer over the ranks
// must take part each time); the first request wins.
log::StopRequest Trainer::stop_requested(const log::IterationRecord& it) {
  log::StopRequest stop;
  for (TrainObserver* o : observers_) {
    const log::StopRequest s = o->stop_requested(it);
    if (s && !stop) stop = s;
  }
  return stop;
}

}  // namespace pl
