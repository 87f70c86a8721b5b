#include "observe/jsonl_log.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/file_checks.h"

namespace pl::observe {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

// null for a value that is not finite (JSON has no NaN).
Json number(double v) { return std::isfinite(v) ? Json(v) : Json(); }
Json number(const std::optional<double>& v) { return v ? number(*v) : Json(); }

}  // namespace

Json memory_json(const MemoryStats& m) {
  return Json{{"allocated_bytes", m.allocated},     {"max_allocated_bytes", m.max_allocated},
              {"reserved_bytes", m.reserved},       {"max_reserved_bytes", m.max_reserved},
              {"alloc_count", m.alloc_count}};
}

Json gemms_json(const std::vector<GemmPath>& paths) {
  Json gemms = Json::array();
  for (const GemmPath& g : paths)
    gemms.push_back(Json{{"format", g.format}, {"execution", g.native ? "native" : "emulated"}, {"description", g.description}});
  return gemms;
}

Json iteration_json(const log::IterationRecord& it) {
  return Json{{"event", "iteration"},
              {"iteration", it.iteration},
              {"train_iters", it.train_iters},
              {"consumed_samples", it.consumed_samples},
              {"global_batch_size", it.global_batch_size},
              {"lm_loss", number(it.lm_loss)},
              {"learning_rate", it.learning_rate},
              {"lr_used", it.lr_used},
              {"grad_norm", number(it.grad_norm)},
              {"loss_scale", it.loss_scale},
              {"skipped", it.skipped},
              {"nan", it.skipped},  // (every skipped step is one with a non-finite loss or norm: Megatron counts both)
              {"elapsed_ms", number(it.seconds * 1e3)},
              {"tflops", number(it.tflops_per_gpu)},
              {"tokens_per_s", number(it.tokens_per_second)}};
}

Json interval_json(const log::IntervalRecord& r) {
  Json j{{"event", "interval"},
         {"iteration", r.iteration},
         {"iterations", r.iterations},
         {"elapsed_ms", number(r.seconds_per_iteration * 1e3)},
         {"tflops", number(r.tflops_per_gpu)},
         {"tokens_per_s", number(r.tokens_per_second)},
         {"lm_loss", number(r.lm_loss)},
         {"learning_rate", r.learning_rate},
         {"grad_norm", number(r.grad_norm)}};
  if (r.params_norm) j["params_norm"] = number(r.params_norm);
  j["skipped_iterations"] = r.skipped_iterations;
  j["nan_iterations"] = r.nan_iterations;
  Json timers = Json::object();
  for (const log::TimerOverRanks& t : r.timers) {
    double lo = t.rank_ms.front().second, hi = lo;
    for (const auto& [rank, ms] : t.rank_ms) lo = std::min(lo, ms), hi = std::max(hi, ms);
    timers[t.name] = Json{{"min", lo}, {"max", hi}};
  }
  j["timers_ms"] = std::move(timers);
  j["memory"] = memory_json(r.memory);
  return j;
}

Json eval_json(const log::EvalRecord& e) {
  return Json{{"event", "eval"},
              {"iteration", e.iteration},
              {"consumed_samples", e.consumed_samples},
              {"split", e.test_split ? "test" : "validation"},
              {"after_training", e.after_training},
              {"lm_loss", number(e.lm_loss)},
              {"ppl", number(std::exp(std::min(20.0, e.lm_loss)))}};
}

Json downstream_eval_json(const log::DownstreamEvalRecord& r, const log::DownstreamTaskScore& t) {
  Json j{{"event", "eval"},
         {"iteration", r.iteration},
         {"consumed_samples", r.consumed_samples},
         {"split", "downstream"},
         {"after_training", r.after_training},
         {"task", t.task},
         {"format", t.format},
         {"documents", t.documents},
         {"num_fewshot", t.num_fewshot},
         {"forward", r.forward},
         {"acc", number(t.acc)},
         {"acc_stderr", number(t.acc_stderr)}};
  if (t.has_acc_norm) {
    j["acc_norm"] = number(t.acc_norm);
    j["acc_norm_stderr"] = number(t.acc_norm_stderr);
  }
  j["seconds"] = number(r.seconds);
  return j;
}

Json end_json(const log::RunEnd& e) {
  Json j{{"event", "end"},
         {"first_iteration", e.first_iteration},
         {"last_iteration", e.last_iteration},
         {"train_iters", e.train_iters},
         {"stop", log::stop_cause_name(e.stop.cause)}};
  if (e.stop.cause == log::StopCause::Signal) j["signal"] = log::signal_name(e.stop.signal);
  const double tokens = e.ran() ? e.tokens_per_second() : std::nan("");
  j["summary_first"] = e.ran() ? Json(e.summary_first) : Json();
  j["summary_last"] = e.ran() ? Json(e.summary_last) : Json();
  j["mean_step_ms"] = e.ran() ? number(e.mean_seconds * 1e3) : Json();
  j["tflops"] = e.ran() ? number(e.mean_tflops) : Json();
  j["tokens_per_s"] = number(tokens);
  j["tokens_per_s_per_gpu"] = number(tokens / static_cast<double>(e.data_parallel_size));
  j["final_lm_loss"] = e.ran() ? number(e.final_loss) : Json();
  j["nan_iterations"] = e.nan_iterations;
  j["valid_lm_loss"] = number(e.valid_loss);
  j["test_lm_loss"] = number(e.test_loss);
  j["allocations_in_loop"] = e.allocations_in_loop;
  j["memory"] = memory_json(e.memory);
  return j;
}

void check_jsonl_output(const std::string& path) {
  PL_CHECK(!path.empty(), "--log-jsonl needs a FILE");
  std::error_code ec;
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  PL_CHECK(fs::is_directory(dir, ec), "--log-jsonl {}: the directory {} does not exist", path, dir.string());
  const fs::file_status st = fs::status(p, ec);
  if (fs::exists(st)) {
    PL_CHECK(fs::is_regular_file(st), "--log-jsonl {}: exists and is not a regular file", path);
    PL_CHECK(::access(path.c_str(), W_OK) == 0, "--log-jsonl {}: cannot write it: {}", path, std::strerror(errno));
  } else {
    PL_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "--log-jsonl {}: cannot create files in {}: {}", path,
             dir.string(), std::strerror(errno));
  }
}

void check_jsonl_replaceable(const std::string& path) {
  // A fresh run replaces the file and a resume appends to it: either way it must be a log of ours.
  check_replaceable_output("--log-jsonl", path, "a JSON-lines log", [](const std::string& p) {
    return json_lines_file_lacks(p, {"event", "schema_version"});
  });
}

JsonLinesLog::JsonLinesLog(std::string path, Json start, bool append, log::NoteFn note)
    : path_(std::move(path)), start_{{"event", "start"}, {"schema_version", 1}}, append_(append), note_(std::move(note)) {
  check_jsonl_output(path_);
  check_jsonl_replaceable(path_);
  for (auto& [key, value] : start.items()) start_[key] = std::move(value);
}

void JsonLinesLog::on_start(const RunStart& s, TrainerAccess&) {
  start_["world_size"] = s.world.size();
  start_["first_iteration"] = s.first_iteration;
}

// One line, one append; the file is opened (and the start line written) by the first one, so a run that fails
// before its first record leaves no file. A failed write leaves the file ending in a whole line (io/record_log.h),
// and a file this run created that holds no line is removed.
void JsonLinesLog::write(const Json& line) {
  if (failed_) return;
  std::string error;
  try {
    if (!file_.valid()) {
      std::error_code ec;
      created_ = !fs::exists(path_, ec);
      file_ = RecordLog(open_fd(path_, O_WRONLY | O_CREAT | (append_ ? 0 : O_TRUNC)));
      error = file_.append(start_.dump() + "\n");
    }
    if (error.empty()) error = file_.append(line.dump() + "\n");
  } catch (const Error& e) {
    error = e.what();
  }
  if (error.empty()) return;
  failed_ = true;
  const bool empty = file_.valid() && file_.whole_bytes() == 0;
  file_.reset();
  std::error_code ec;
  if (created_ && empty) fs::remove(path_, ec);
  if (note_) note_(fmt::format("WARNING: --log-jsonl: {}: the run goes on without its JSON-lines log", error));
}

void JsonLinesLog::on_iteration(const log::IterationRecord& it) { write(iteration_json(it)); }
void JsonLinesLog::on_interval(const log::IntervalRecord& r) { write(interval_json(r)); }
void JsonLinesLog::on_eval(const log::EvalRecord& e) { write(eval_json(e)); }

void JsonLinesLog::on_downstream_eval(const log::DownstreamEvalRecord& r) {
  for (const log::DownstreamTaskScore& t : r.tasks) write(downstream_eval_json(r, t));
}

void JsonLinesLog::on_end(const log::RunEnd& e) {
  write(end_json(e));
  if (file_.valid()) {
    try {
      file_.close();
    } catch (const Error& err) {
      if (note_) note_(fmt::format("WARNING: --log-jsonl: {}", err.what()));
    }
  }
}

}  // namespace pl::observe
