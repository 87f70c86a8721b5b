#pragma once
// What watches a training run: every output of the loop (the Megatron text log, TensorBoard, the
// JSON-lines log, the roofline, quantization statistics, the profiler window, checkpoints, stop conditions)
// is a TrainObserver handed to the Trainer once, in its constructor. The trainer calls each observer, in
// the order given, at each event with the event's record (log/run_records.h); an observer keeps its own
// settings and state, so adding an output touches its observer and the app's list, not the loop.
//
// One run's events, in order:
//   on_start                                   before the first iteration (after a resume's restore point)
//   per iteration:
//     before_iteration(n, requests)            what the observers need measured in iteration n
//     on_iteration(IterationRecord)            its step's numbers
//     on_interval(IntervalRecord)              at every --log-interval and the last iteration
//     on_eval(EvalRecord)                      every --eval-interval
//     stop_requested(IterationRecord)          asked of every observer, every iteration (the first request wins)
//     on_iteration_end(IterationEnd)           the loop state after it, and whether it was the last
//   on_eval(EvalRecord) x2                     the validation and test splits after training (not after an early stop)
//   on_end(RunEnd)                             the summary
// Every rank calls every observer alike (the same list on every rank: an observer that prints decides by
// its rank; one that all-reduces does so on every rank). An observer's stop request must agree over the
// ranks: one that decides on a rank's own fact (a signal, the clock) combines it over the ranks itself.
#include <cstdint>

#include "config/train_config.h"
#include "log/run_records.h"
#include "parallel/world.h"
#include "train/train_state.h"

namespace pl {

class LlamaModel;
class AdamW;
class Timers;

// What an observer needs the trainer to measure, asked once when the trainer is built.
struct Instruments {
  bool op_rows = false;     // the timers keep per-op rows (core/timers.h OpRow) for whoever activates them
  bool ops_timed = false;   // every op reports to the run's timers (NVTX ranges, op rows) at any timing level
};

// What observers ask of the next iteration before it runs.
struct IterationRequests {
  bool quant_stats = false;  // its last micro-batch's backward records quantization telemetry
};

// Before the first iteration.
struct RunStart {
  const TrainConfig& cfg;
  const parallel::World& world;
  const LlamaModel& model;
  Timers& timers;               // the run's timers; valid until on_end returns
  int64_t first_iteration = 1;  // 1-based: the checkpoint's iteration + 1 on a resume
};

// After an iteration's log interval and evaluation.
struct IterationEnd {
  const TrainState& state;  // the loop state after the iteration (what a checkpoint saves)
  bool last = false;        // the last iteration this process runs (--train-iters reached, or a stop)
  log::StopRequest stop;    // why it stops before --train-iters (no request: it does not)
};

// What an observer may use of the trainer it observes, during on_start and on_iteration_end: the model, and
// the optimizer with every overlap finished (a save or a restore reads or writes the weights, masters and
// moments).
class TrainerAccess {
 public:
  virtual LlamaModel& model() = 0;
  virtual AdamW& settled_optimizer() = 0;

 protected:
  ~TrainerAccess() = default;
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual Instruments instruments() const { return {}; }
  virtual void on_start(const RunStart&, TrainerAccess&) {}
  virtual void before_iteration(int64_t /*iteration*/, IterationRequests&) {}
  virtual void on_iteration(const log::IterationRecord&) {}
  virtual void on_interval(const log::IntervalRecord&) {}
  virtual void on_eval(const log::EvalRecord&) {}
  // --downstream-eval's scores (issue 43): published by observe/downstream_eval's observer from its
  // on_iteration_end to the outputs that show them (the app wires it; the trainer never calls this).
  virtual void on_downstream_eval(const log::DownstreamEvalRecord&) {}
  // A request makes this iteration the last: its checkpoint is saved (last = true) and the evaluations
  // after training are skipped, as Megatron's exits. May throw pl::Error to end the run with an error.
  virtual log::StopRequest stop_requested(const log::IterationRecord&) { return {}; }
  virtual void on_iteration_end(const IterationEnd&, TrainerAccess&) {}
  virtual void on_end(const log::RunEnd&) {}
};

}  // namespace pl
