#pragma once
// --log-jsonl FILE: the run as JSON lines, one object per event, for scripts (scripts/jsonl_log.py reads it;
// the schema, key by key, is in README.md "The JSON-lines log"). Every line has an "event": "start" (the
// banner's facts, given by the app), "iteration" (one per iteration), "interval" (each --log-interval: the
// Megatron line's numbers, the timers, memory), "eval" (each evaluation), "end" (the summary). Keys are
// snake_case; floats are written at full precision (the shortest text that reads back to the same double),
// a value that is not finite as null. Each line goes out with one write(2), so `tail -f` sees whole lines and
// a reader needs only skip an incomplete last one.
//   The file is created when the run's first event after the start arrives (the first iteration, or the end of
//   a run that had none to run): a run that fails before it leaves no file, and an existing file there as it
//   was. A run from iteration 0 replaces the file; a resumed run (append) adds to it, its own "start" line
//   first. Written by the last rank only (Megatron's print_rank_last; the app makes it there). A write that
//   fails (a full disk) is one warning, and the run goes on without the log.
#include <nlohmann/json.hpp>

#include <string>

#include "backend/device_info.h"
#include "io/fd.h"
#include "io/record_log.h"
#include "log/tensorboard.h"
#include "train/observer.h"

namespace pl::observe {

// FILE can be written: its directory exists and takes files; FILE, if it exists, is a regular file this process
// may write. One-line errors naming --log-jsonl; nothing is created.
void check_jsonl_output(const std::string& path);
// An existing FILE must be a JSON-lines log of this program (its first line a start event): io/file_checks.h's
// check_replaceable_output.
void check_jsonl_replaceable(const std::string& path);

class JsonLinesLog : public TrainObserver {
 public:
  // `start`: the facts of the "start" line (the app's banner); checked with check_jsonl_output, nothing created yet.
  JsonLinesLog(std::string path, nlohmann::ordered_json start, bool append, log::NoteFn note);
  void on_start(const RunStart& s, TrainerAccess&) override;
  void on_iteration(const log::IterationRecord& it) override;
  void on_interval(const log::IntervalRecord& r) override;
  void on_eval(const log::EvalRecord& e) override;
  void on_downstream_eval(const log::DownstreamEvalRecord& r) override;
  void on_end(const log::RunEnd& e) override;

 private:
  void write(const nlohmann::ordered_json& line);
  std::string path_;
  nlohmann::ordered_json start_;
  bool append_;
  log::NoteFn note_;
  RecordLog file_;  // whole lines only: a write that fails part way is cut back to the last whole line
  bool created_ = false, failed_ = false;
};

// The records as JSON-lines objects (also what the tests compare).
nlohmann::ordered_json iteration_json(const log::IterationRecord& it);
nlohmann::ordered_json interval_json(const log::IntervalRecord& r);
nlohmann::ordered_json eval_json(const log::EvalRecord& e);
// --downstream-eval: one "eval" line per task, split "downstream", with the task's lm-eval accuracies.
nlohmann::ordered_json downstream_eval_json(const log::DownstreamEvalRecord& r, const log::DownstreamTaskScore& t);
nlohmann::ordered_json end_json(const log::RunEnd& e);
nlohmann::ordered_json memory_json(const MemoryStats& m);
// The start line's "gemms": how each GEMM format runs (backend/device_info.h gemm_paths).
nlohmann::ordered_json gemms_json(const std::vector<GemmPath>& paths);

}  // namespace pl::observe
