#include "observe/tensorboard_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace pl::observe {

TensorBoardLog::TensorBoardLog(const TensorBoardConfig& cfg, log::NoteFn note)
    : cfg_(cfg),
      note_(note),
      writer_(cfg.dir, static_cast<size_t>(std::max<int64_t>(1, cfg.queue_size)), std::move(note)) {
  cfg_.log_interval = std::max<int64_t>(1, cfg_.log_interval);
}

TensorBoardLog::~TensorBoardLog() {
  if (reached_a_record_) return;  // (the writer's own destructor closes it)
  try {
    writer_.discard();
  } catch (...) {  // (a note that throws must not end the program from a destructor)
  }
}

void TensorBoardLog::pair(const std::string& tag, double value, int64_t iteration, int64_t consumed_samples) {
  writer_.add_scalar(tag, value, iteration);
  writer_.add_scalar(tag + " vs samples", value, consumed_samples);
}

// Megatron's training_log writes these every --tensorboard-log-interval: the iteration's loss, the rate the
// next step uses and the step's gradient norm, as the iteration line prints them at --log-interval 1.
void TensorBoardLog::on_iteration(const log::IterationRecord& s) {
  reached_a_record_ = true;
  if (s.iteration % cfg_.log_interval != 0) return;
  pair("learning-rate", s.learning_rate, s.iteration, s.consumed_samples);
  pair("batch-size", static_cast<double>(s.global_batch_size), s.iteration, s.consumed_samples);
  pair("lm loss", s.lm_loss, s.iteration, s.consumed_samples);
  if (cfg_.log_loss_scale) pair("loss-scale", s.loss_scale, s.iteration, s.consumed_samples);
  if (cfg_.log_world_size) pair("world-size", static_cast<double>(s.world_size), s.iteration, s.consumed_samples);
  if (!std::isnan(s.grad_norm)) pair("grad-norm", s.grad_norm, s.iteration, s.consumed_samples);
  if (cfg_.log_memory) {
    // (Megatron's names, from torch.cuda.memory_stats(): reserved_bytes, allocated_bytes, its peak and the
    // live allocation count; the values are the memory line's.)
    writer_.add_scalar("mem-reserved-bytes", static_cast<double>(s.memory.reserved), s.iteration);
    writer_.add_scalar("mem-allocated-bytes", static_cast<double>(s.memory.allocated), s.iteration);
    writer_.add_scalar("mem-max-allocated-bytes", static_cast<double>(s.memory.max_allocated), s.iteration);
    writer_.add_scalar("mem-allocated-count", static_cast<double>(s.memory.alloc_count), s.iteration);
  }
}

void TensorBoardLog::on_interval(const log::IntervalRecord& s) {
  writer_.add_scalar("iteration-time", s.seconds_per_iteration, s.iteration);
  writer_.add_scalar("throughput", s.tflops_per_gpu, s.iteration);
  writer_.add_scalar("throughput/tokens_per_sec", s.tokens_per_second, s.iteration);
  if (cfg_.log_timers)
    for (const log::TimerOverRanks& t : s.timers) {
      double max_ms = 0.0;
      for (const auto& rank_ms : t.rank_ms) max_ms = std::max(max_ms, rank_ms.second);
      writer_.add_scalar(std::string(t.name) + "-time", max_ms / 1e3, s.iteration);
    }
  writer_.flush();
}

void TensorBoardLog::on_eval(const log::EvalRecord& e) {
  reached_a_record_ = true;
  const std::string tag = e.test_split ? "lm loss test" : "lm loss validation";
  pair(tag, e.lm_loss, e.iteration, e.consumed_samples);
  if (cfg_.log_validation_ppl) pair(tag + " ppl", std::exp(std::min(20.0, e.lm_loss)), e.iteration, e.consumed_samples);
  writer_.flush();
}

// --downstream-eval: "downstream/<task>/acc" (and acc_norm where reported), with their "vs samples".
void TensorBoardLog::on_downstream_eval(const log::DownstreamEvalRecord& r) {
  reached_a_record_ = true;
  for (const log::DownstreamTaskScore& t : r.tasks) {
    pair("downstream/" + t.task + "/acc", t.acc, r.iteration, r.consumed_samples);
    if (t.has_acc_norm) pair("downstream/" + t.task + "/acc_norm", t.acc_norm, r.iteration, r.consumed_samples);
  }
  writer_.flush();
}

void TensorBoardLog::on_end(const log::RunEnd&) {
  reached_a_record_ = true;
  const std::string summary = close();
  if (note_) note_(summary);
}

std::string TensorBoardLog::close(double timeout_s) {
  writer_.close(timeout_s);
  const int64_t dropped = writer_.dropped();
  const std::string lost =
      dropped > 0 ? fmt::format(", {} dropped (the writer could not keep up, or the disk failed)", dropped) : "";
  return fmt::format("tensorboard: {} scalars written to {}{}", std::max<int64_t>(0, writer_.written() - 1), path(),
                     lost);
}

}  // namespace pl::observe
