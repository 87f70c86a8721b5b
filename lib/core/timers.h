#pragma once
// Megatron's timers (--timing-log-level 0|1|2), followed from Megatron-LM megatron/core/timers.py
// (Timers, Timer) and megatron/training/training.py (training_log: timers_to_log by level, logged
// with normalizer=args.log_interval after the iteration line). Own code; only the names, levels
// and semantics come from there.
//
// A timer sums the time of the regions it brackets (start .. stop) until it is read at the log
// interval. Level 0 (Megatron's default) measures nothing: every call returns at once and no
// device event is ever recorded. Level 1 adds the phases that run about once per iteration, level 2
// those that run many times (per micro-batch, per op).
//
// Measurement. CPU: steady_clock wall time (the CPU backend's ops are synchronous). CUDA: a pair
// of events recorded on the default stream around each region, so a timer measures the stream's
// time between its start and its stop (queued GPU work included; host-only work such as batch
// generation shows as the time the GPU waited for it). The events come from a fixed pool created
// with the Timers object (before the training loop): read() synchronizes once on the newest event
// and sums the elapsed times; a pool that fills up inside an interval is read the same way early
// and reused (at level 2 with very many ops per interval: one extra synchronize per pool-full).
//
// Per-op categories: the op dispatch layer (backend/ops.cpp) brackets every op with an OpTimer of its
// category on the Timers of the op's context (OpContext::timers); it times only when the context has
// one and the category's level is enabled, and only the outermost op when ops nest.
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/op_cost.h"
#include "core/tensor.h"

namespace pl {

// Every timer this program has, in print order: Megatron's level-1 names in training_log's order,
// then Megatron's level-2 names, then this program's per-op categories (level 2). A Megatron timer
// this program has no counterpart of (gradient all-reduces, params-all-gather, pipeline send/recv,
// optimizer-unscale-and-check-inf, optimizer-count-zeros) is absent.
enum class TimerId : uint8_t {
  // level 1 (Megatron's names)
  ForwardBackward,                 // "forward-backward": every micro-batch's batch, forward and backward
  OptimizerCopyToMainGrad,         // "optimizer-copy-to-main-grad": with --optimizer-cpu-offload, the host
                                   //   waiting for each chunk's gradient copy (and its staging slot's upload)
  OptimizerClipMainGrad,           // "optimizer-clip-main-grad": the gradient norm (the clip is fused
                                   //   into the AdamW update) -- the sum_of_squares op
  OptimizerInnerStep,              // "optimizer-inner-step": the AdamW update ops
  OptimizerCopyMainToModelParams,  // "optimizer-copy-main-to-model-params": quantized weight copies for
                                   //   the next step (prepare_weights; the bf16 copy is fused into AdamW)
  Optimizer,                       // "optimizer": the whole optimizer step, the three above included
  AllGradsSync,                    // "all-grads-sync": data parallelism, after the last backward: the
                                   //   gradient reduction still outstanding (finalize_model_grads)
  ParamsAllGather,                 // "params-all-gather": the distributed optimizer's weight all-gather
  // level 2 (Megatron's names)
  BatchGenerator,  // "batch-generator": filling one micro-batch's tokens and labels (inside forward-compute)
  ForwardCompute,  // "forward-compute": batch, upload, forward and the loss of each micro-batch
  BackwardCompute, // "backward-compute": everything after the loss op, recomputation included
  // level 2: per-op categories (disjoint: the sum is the time spent inside ops)
  GemmBf16,        // "gemm-bf16": linear_forward / linear_backward_input / linear_backward_weight
  GemmFp8,         // "gemm-fp8": quantized_gemm of FP8 (E4M3/E5M2) copies
  GemmMxfp8,       // "gemm-mxfp8"
  GemmNvfp4,       // "gemm-nvfp4"
  Attention,       // "attention": attention_forward / attention_backward
  Quantization,    // "quantization": quantize (every format, weights and activations)
  QuantStats,      // "quant-stats": telemetry ops (dequantize, quant_stats, columnwise_source)
  RmsNorm,         // "rmsnorm"
  Rope,            // "rope"
  Swiglu,          // "swiglu"
  Embedding,       // "embedding"
  CrossEntropy,    // "cross-entropy": the fused loss and its gradient
  Elementwise,     // "elementwise": add, fill_zero, copy_master_to_param
  kCount
};
inline constexpr size_t kTimerCount = static_cast<size_t>(TimerId::kCount);

const char* timer_name(TimerId id);
int timer_level(TimerId id);  // 1 or 2

// One timer's reading at the log interval.
struct TimerReading {
  TimerId id;
  const char* name;
  double ms;  // per iteration: the interval's sum divided by the normalizer given to read()
};

// One row of the roofline report (--roofline): every op call with the same key while op rows were
// active, summed. Its time is the very measurement the op's timer category gets, so the rows of a
// category add up to that category's timer over the same iterations.
struct OpRow {
  OpRowKey key;
  TimerId category = TimerId::kCount;  // the op's timer category
  int64_t calls = 0;
  double ms = 0.0;
  double flops = 0.0, bytes = 0.0;
  double working_set = 0.0;  // the largest single call's
};

class Timers {
 public:
  static constexpr int kMaxLevel = 2;
  // Event pairs in the pool (CUDA only) by level: level 1 times a handful of regions per iteration,
  // level 2 every op.
  static constexpr size_t kPoolPairsLevel1 = 1024;
  static constexpr size_t kPoolPairsLevel2 = 16384;

  // level: 0, 1 or 2 (one-line error otherwise). op_rows (--roofline): every op is timed, whatever the
  // level, and attributed to its row while op rows are active; read() still returns only the level's
  // timers. On a CUDA device that times anything the event pool is created here.
  Timers(Device device, int level, bool op_rows = false);
  ~Timers();
  Timers(const Timers&) = delete;
  Timers& operator=(const Timers&) = delete;

  int level() const { return level_; }
  // Printed at this level (read() returns it).
  bool enabled(TimerId id) const { return level_ > 0 && timer_level(id) <= level_; }

  // A timer's region; nothing happens for a timer above the level. Starting a running timer or
  // stopping one that is not running is an internal error (as Megatron's asserts).
  void start(TimerId id);
  void stop(TimerId id);
  bool running(TimerId id) const { return running_[static_cast<size_t>(id)] != kNotRunning; }

  // The timers that ran since the last read, in print order, each divided by `normalizer` (the
  // iterations of the interval: Megatron's normalizer=args.log_interval); resets them all. On CUDA:
  // one synchronize. The returned span stays valid until the next read.
  std::span<const TimerReading> read(double normalizer);

  // The op dispatch layer's side (see OpTimer): true when it started timing `id`.
  bool op_begin(TimerId id);
  void op_end(TimerId id) noexcept;  // errors are deferred to the next start/read

  // ---- op rows (--roofline) ----
  // The measurement window: rows accumulate only while active (the trainer's choice of iterations).
  void set_op_rows_active(bool on);
  bool op_rows_active() const { return op_rows_ && rows_active_; }
  // The dispatch layer, right after op_begin returned true: the running op's cost and tag; its time
  // goes to the row of costs.phase[0] (op_rows_active() only).
  void op_attach(const OpCosts& costs, OpTag tag);
  // The backend, inside a two-phase op (an emulated quantized GEMM): the first phase ends here and the
  // rest of the op's time goes to phase[1]'s row. Nothing happens when no second phase is attached.
  void op_next_phase();
  // The rows so far, in the order first seen (CUDA: synchronizes once to read pending events).
  std::span<const OpRow> op_rows();
  void clear_op_rows();

 private:
  static constexpr uint32_t kNotRunning = 0xFFFFFFFFu;
  bool op_timed(TimerId id) const { return enabled(id) || op_rows_; }
  // A region of `id`, whatever the level (start/stop check the level first): errors as start/stop's.
  void begin_region(TimerId id);
  void end_region(TimerId id);
  void record_start(size_t idx);
  void record_stop(size_t idx);
  int row_of(const OpCost& c, OpTag tag, TimerId category);
  void add_row_ms(int row, double ms) {
    if (row >= 0) rows_[static_cast<size_t>(row)].ms += ms;
  }
  void drain();  // CUDA: synchronize, add every finished pair to sums_, free the pool
  void rethrow_deferred();

  Device device_;
  int level_;
  std::array<double, kTimerCount> sums_ms_{};
  std::array<int64_t, kTimerCount> counts_{};
  std::array<uint32_t, kTimerCount> running_;  // pool pair (CUDA) or 0 (CPU) of a running timer
  std::array<std::chrono::steady_clock::time_point, kTimerCount> t0_{};
  std::array<TimerReading, kTimerCount> readings_{};
  int op_depth_ = 0;
  std::string deferred_error_;
  // CUDA event pool: events_[2k], events_[2k+1] are pair k; pending_[i] is the timer of pair i.
  std::vector<void*> events_;
  std::vector<TimerId> pending_owner_;
  size_t next_pair_ = 0;
  void* last_recorded_ = nullptr;
  std::vector<int> pending_row_;  // pair i's op row (-1: none)
  // Op rows (--roofline): the running outermost op's category and the rows of its current and next phase.
  bool op_rows_ = false;
  bool rows_active_ = false;
  std::vector<OpRow> rows_;
  TimerId op_category_ = TimerId::kCount;
  int op_row_ = -1, op_next_row_ = -1;
  bool op_nvtx_ = false;  // the running op pushed an NVTX range
};

// Brackets one op in the dispatch layer on `t` (the op context's Timers). With none (the trainer gives
// none at level 0) it costs one branch.
class OpTimer {
 public:
  OpTimer(Timers* t, TimerId id) : id_(id) {
    if (t != nullptr && t->op_begin(id)) timers_ = t;
  }
  // True while a roofline report is measuring: the dispatcher then computes the op's costs and attaches
  // them (the op's own name fills in a phase without one).
  bool measuring_rows() const { return timers_ != nullptr && timers_->op_rows_active(); }
  void attach(const char* op, OpTag tag, OpCosts costs) const {
    for (OpCost& c : costs.phase)
      if (c.op == nullptr) c.op = op;
    timers_->op_attach(costs, tag);
  }
  ~OpTimer() {
    if (timers_ != nullptr) timers_->op_end(id_);
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  TimerId id_;
  Timers* timers_ = nullptr;
};

}  // namespace pl
