#pragma once
// The Megatron-Bridge log lines, to the character (SPEC-MEGATRON §1a), in one place, so that
// grep/parse scripts written for Megatron logs work on ours.
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/memory_stats.h"
#include "core/timers.h"
#include "log/run_records.h"

namespace pl::log {

// " [YYYY-mm-dd HH:MM:SS] iteration        1/      50 | consumed samples: ... |"
// The log interval's numbers (run_records.h): elapsed time, loss and counts are the interval's, the learning
// rate the next step's, the grad norm the last iteration's.
std::string iteration_line(const IntervalRecord& r, const std::string& timestamp);
// "Step Time : 5.39s GPU utilization: 2347.0MODEL_TFLOP/s/GPU"
std::string step_time_line(double seconds_per_iteration, double tflops_per_gpu);
// "[Rank 0] (after 1 iterations) memory (GB) | mem-allocated-gigabytes: 45.123 | ..."
std::string memory_line(int rank, int64_t iteration, const MemoryStats& s);
// "FINAL mem-reserved-gigabytes: ... " (the playbook's own closing line)
std::string final_memory_line(const MemoryStats& s);
// Megatron's evaluate_and_print_results: a rule of '-', the line, the rule again (the rule is one
// longer than the line). prefix is "iteration 25", or "iteration 50 on validation set" / "... on
// test set" after training:
//   " validation loss at iteration 25 | lm loss value: 4.123456E+00 | lm loss PPL: 6.173456E+01 | "
// PPL = exp(min(20, loss)).
// --downstream-eval (issue 43): one line per task, " downstream eval at iteration N | TASK | acc: 0.2800 | acc_stderr:
// 0.0318 | acc_norm: ... | documents: 200 | 0-shot | forward: ... |" (acc_norm only where lm-eval reports it).
std::vector<std::string> downstream_eval_lines(const DownstreamEvalRecord& r);
std::array<std::string, 3> validation_lines(const std::string& prefix, double lm_loss);
// Megatron's theoretical_memory_utils lines, one string with '\n' between them.
std::string parameter_lines(double transformer_params, double embedding_params, double bytes_per_param);

// Megatron's timers.log block (--timing-log-level 1|2), one string per line, printed after the
// iteration line of each log interval; empty when no timer ran. option is --timing-log-option:
//   minmax (Megatron's default)  "(min, max) time across ranks (ms):"
//                                "    forward-backward ...............................: (123.45, 123.45)"
//   max                          "max time across ranks (ms):" / "    <name ...>: 123.45"
//   all                          "times across ranks (ms):" / "  <name>:" / "     rank  0: 123.45"
// The name and a space are padded with '.' to 48 characters. One process: min = max = the value.
std::vector<std::string> timer_lines(std::span<const TimerReading> timers, const std::string& option);
// The same over data-parallel ranks: each timer's value on every rank that ran it (rank order).
std::vector<std::string> timer_lines(std::span<const TimerOverRanks> timers, const std::string& option);

// Megatron's checkpoint lines (megatron/training/checkpointing.py: save_checkpoint, load_checkpoint,
// _load_base_checkpoint); the success lines with the size and speed appended.
//   "saving checkpoint at iteration      10 to DIR in pl_flat format"
//   "  successfully saved checkpoint from iteration      10 to DIR (PATH: 0.001 GB in 0.01 s, 0.10 GB/s)"
std::string saving_checkpoint_line(int64_t iteration, const std::string& dir);
std::string saved_checkpoint_line(int64_t iteration, const std::string& dir, const std::string& path, double bytes,
                                  double seconds);
//   " loading checkpoint from DIR at iteration 10"
//   "  successfully loaded checkpoint from DIR [ t 1/1, p 1/1 ] at iteration 10 (PATH: 0.002 GB verified and
//    read in 0.01 s, 0.20 GB/s)"  (bytes: verified + read)
std::string loading_checkpoint_line(const std::string& dir, int64_t iteration);
std::string loaded_checkpoint_line(const std::string& dir, int64_t iteration, const std::string& path, double bytes,
                                   double seconds);
// --load of an empty --save directory: "WARNING: could not find the metadata file DIR/TRACKER" and
// "    will not load any checkpoints and will start from random".
std::array<std::string, 2> no_checkpoint_lines(const std::string& dir, const std::string& tracker);

// Local time "YYYY-mm-dd HH:MM:SS" (Bridge: no microseconds).
std::string now_timestamp();
// Python's repr() of round(x, 4 - floor(log10|x|)): how Bridge prints memory figures.
std::string python_round5_repr(double x);
// Python's repr() of a float (shortest round-trip digits, Python's fixed/scientific switch).
std::string python_float_repr(double x);

}  // namespace pl::log
